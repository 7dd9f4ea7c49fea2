"""Hardware figures cite their sources as data: the loader checks every citation."""

import pytest

from conftest import run_cli, snapshot


@pytest.mark.parametrize(
    "old, new, fragment",
    [
        ('sm_count = "WP DEV"\n', "", "cite: 'sm_count' is not cited"),
        (
            'sm_count = "WP DEV"',
            'sm_count = "WP WIKI"',
            "cite.sm_count: names no source of [sources] (CCG, DS, WP, DEV, CCCL, PTX)",
        ),
        ('sm_count = "WP DEV"', 'sm_count = "measured:"', "cite.sm_count: 'measured:' needs a reason after it"),
        (
            'sm_count = "WP DEV"',
            'sm_count = "WP DEV"\nsm_counts = "WP"',
            "cite.sm_counts: not a number or feature of the spec",
        ),
        (
            'bytes_in_flight = "CCCL"',
            'bytes_in_flight = "inferred: like the H100"',
            "sources.CCCL: no number cites this source",
        ),
    ],
    ids=["uncited", "unknown source", "no reason", "not a field", "unused source"],
)
def test_citations_are_checked(project, old, new, fragment):
    path = project / "specs/hardware/h200.toml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    before = snapshot(project / "generated")
    result = run_cli("--root", str(project), "build")
    assert result.code == 2 and "Traceback" not in result.err, result
    assert fragment in result.err
    assert snapshot(project / "generated") == before


def test_show_sources_prints_every_figure_with_its_citation():
    out = run_cli("show", "--sources", "--hw", "bi_v100").out
    assert "  sm_count = 16: [SEED]" in out
    # The BI-V100 figures that are not published say how they were obtained.
    assert "  max_threads_per_sm = 1024: inferred: not published" in out
    assert "  bytes_in_flight = 65536: measured: the seed's bench_bi100.py" in out
    assert "    [SEED] shared/seeds/muh_cc_dispatch.py" in out
    every = run_cli("show", "--sources").out
    assert every.count("== ") == 10 and "mi300x" in every
