"""bench/peers.py: the vLLM peers are imported from beside the repository when the file is there,
and their absence is said, not hidden (the benchmarks then leave the peer columns out)."""

import importlib
import sys

from conftest import REPO


def load_peers(monkeypatch, value):
    monkeypatch.syspath_prepend(str(REPO))
    if value is None:
        monkeypatch.delenv("VLLM_PEERS", raising=False)
    else:
        monkeypatch.setenv("VLLM_PEERS", value)
    peers = importlib.import_module("bench.peers")
    monkeypatch.delitem(sys.modules, "vllm_triton_peer", raising=False)
    return peers


def test_missing_peer_file_is_reported(monkeypatch, tmp_path):
    peers = load_peers(monkeypatch, str(tmp_path / "nowhere.py"))
    module, why = peers.load()
    assert module is None and "not found" in why and "nowhere.py" in why


def test_empty_variable_switches_the_peers_off(monkeypatch):
    peers = load_peers(monkeypatch, "")
    module, why = peers.load()
    assert module is None and "switched off" in why


def test_a_peer_file_that_fails_to_import_is_reported(monkeypatch, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("raise RuntimeError('broken peer')\n")
    peers = load_peers(monkeypatch, str(bad))
    module, why = peers.load()
    assert module is None and "broken peer" in why and "vllm_triton_peer" not in sys.modules


def test_a_peer_file_is_imported_from_its_path(monkeypatch, tmp_path):
    good = tmp_path / "fake_peer.py"
    good.write_text("MARK = 'from the side'\n")
    peers = load_peers(monkeypatch, str(good))
    module, why = peers.load()
    assert why is None and module.MARK == "from the side"
    assert peers.DEFAULT == REPO.parent / "shared" / "peers" / "vllm_triton.py"  # never inside the repo
