"""``python -m codegen tune KERNEL ...`` and ``python -m codegen tune merge FILES...``.

``tune`` plans, measures with one worker process per visible GPU (each pinned with
``CUDA_VISIBLE_DEVICES``, taking every n-th chunk) or one shard (``--shard i/n``, for a batch
scheduler: no write-back, a results file), then decides and writes the winners into the spec,
checks that the edited specs build, and rebuilds generated/.  ``merge`` folds results files of
one tune (from any hosts) and writes as ``tune`` would.  Exit codes as the other commands
(``codegen/exitcodes.py``): 2 for bad input, one line per problem naming the option or the file
and line, with nothing written (an unknown kernel, target or model, a bad --space or one too
large to plan, a target whose GPU is not here, a results file tune did not write or of another
plan, specs edited while tune ran, another build holding the lock), 3 for a bug.  ``--plan``
stops after the plan; ``--dry-run`` measures into a temporary folder and prints the diff.
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence, TextIO

from .. import pipeline, write
from ..errors import SpecErrors
from ..exitcodes import EXIT_INVALID, EXIT_OK
from ..records import SpecTree
from . import results as results_mod
from .decide import Verdict, decide
from .plan import Plan, PlanError, cli_space, plan
from .results import ResultsError, ResultsFile
from .writeback import Edit, WriteBackError, changes, edits

RESULTS_DIR = ".codegen-tune"


class TuneError(Exception):
    """Bad usage of tune (exit 2)."""


def run(args: argparse.Namespace, root: Path, argv: Sequence[str], out: TextIO, err: TextIO) -> int:
    try:
        if args.kernel == "merge":
            return _merge(args, root, argv, out, err)
        if args.files:
            raise TuneError(f"unexpected arguments {' '.join(args.files)} (only `tune merge` takes files)")
        _check_options(args)
        return _tune(args, root, argv, out, err)
    except (PlanError, ResultsError, WriteBackError, TuneError, write.OutputError) as exc:
        print(f"codegen tune: {exc}", file=err)
        return EXIT_INVALID


# -- options --------------------------------------------------------------------------------

# Options that decide a plan or a measurement: `tune merge` takes them from the results' header.
_PLAN_OPTIONS = ("shapes", "space", "buckets", "rounds", "chunk", "model", "dtype", "shard", "devices", "budget")


def _check_options(args: argparse.Namespace) -> None:
    """Options checked before anything is loaded or written (names are checked against the
    specs when the plan is made: --hw, the config, --space fields, --buckets, --model)."""
    _shapes(args.shapes)
    for flag in ("chunk", "rounds"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise TuneError(f"--{flag} {value}: must be at least 1")
    if args.budget is not None and not (math.isfinite(args.budget) and args.budget > 0):
        raise TuneError(f"--budget {args.budget:g}: must be a positive number of seconds")
    if args.shard is not None:
        _shard(args.shard)
        if args.devices:
            raise TuneError("--shard measures on the device here; --devices goes with a tune of all shards")
        if args.dry_run:
            raise TuneError("--shard writes only its results file, never specs: drop --dry-run (or --shard)")
    if args.devices is not None:
        ids = [d.strip() for d in args.devices.split(",")]
        if (
            not all(ids)
            or len(set(ids)) != len(ids)
            or not all(d.isdigit() or d.startswith(("GPU-", "MIG-")) for d in ids)
        ):
            raise TuneError(
                f"--devices {args.devices!r}: give distinct GPU ids (0,1 or GPU-... UUIDs), comma-separated"
            )
    if args.plan and (args.dry_run or args.no_build or args.fresh):
        raise TuneError("--plan measures and writes nothing: it does not go with --dry-run, --no-build or --fresh")


def _check_merge_options(args: argparse.Namespace) -> None:
    given = [f"--{f}" for f in _PLAN_OPTIONS if getattr(args, f) not in (None, [], False)]
    given += ["--hw"] if args.hw != "auto" else []
    given += ["--fresh"] if args.fresh else []
    given += ["--plan"] if args.plan else []
    if given:
        raise TuneError(
            f"merge: {', '.join(given)} do not apply: the plan is the one the results' header records "
            "(merge takes --scope, --dry-run, --no-build, --quiet)"
        )


def _shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise TuneError(f"--shard: expected I/N, got {text!r}") from None
    if not (0 <= i < n):
        raise TuneError(f"--shard {text}: I must be in 0..N-1")
    return i, n


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


def _device_here(tree: SpecTree, target: str, root: Path, devices: Sequence[str] | None) -> None:
    """Refuse a measurement of ``target`` where no device of it is: no GPU visible (unless
    Triton's interpreter runs the kernels on the CPU), or a visible one of another part."""
    if _interpreted():
        return
    try:
        import torch
    except ImportError:
        raise TuneError("measuring needs torch; pass --plan to plan only") from None
    how = "pass --plan to plan only, or set TRITON_INTERPRET=1 to time in Triton's CPU interpreter"
    if not torch.cuda.is_available():
        raise TuneError(f"--hw {target}: no GPU is visible here, so nothing of {target} can be timed; {how}")
    count = torch.cuda.device_count()
    if devices is None:
        indexes = list(range(count))
    elif os.environ.get("CUDA_VISIBLE_DEVICES") is None and all(d.isdigit() for d in devices):
        missing = [d for d in devices if int(d) >= count]
        if missing:
            raise TuneError(f"--devices: no GPU {', '.join(missing)} here ({count} visible)")
        indexes = [int(d) for d in devices]
    else:
        indexes = []  # ids this process cannot map: each worker checks its own device
    found = {i: _detect(root, i) for i in indexes}
    wrong = {i: name for i, name in found.items() if name != target}
    if wrong:
        listed = ", ".join(f"GPU {i} is {name}" for i, name in sorted(wrong.items()))
        raise TuneError(f"--hw {target}: {listed}, not {target}: run where an {target} is, or pass --devices; {how}")


def _detect(root: Path, index: int) -> str:
    """The hardware spec name of CUDA device ``index``, as the built tree detects it."""
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        from generated.dispatch import target_name  # the built tree's own detection
    except ImportError as exc:
        raise TuneError(f"detecting the device needs the built generated/ package ({exc})") from None
    try:
        return target_name(None, device=index)
    except (KeyError, ValueError, RuntimeError) as exc:
        return f"unknown ({exc})"


# -- planning -------------------------------------------------------------------------------


def _shapes(texts: Sequence[str] | None) -> list[tuple[int, ...]] | None:
    if not texts:
        return None
    shapes = []
    for t in texts:
        try:
            shape = tuple(int(x) for x in t.lower().split("x"))
        except ValueError:
            raise TuneError(f"--shapes: {t!r} is not AxBxC (positive integers)") from None
        if any(x <= 0 for x in shape):
            raise TuneError(f"--shapes: {t!r} has a dimension <= 0")
        shapes.append(shape)
    return shapes


def _target(tree: SpecTree, hw: str, root: Path) -> str:
    if hw != "auto":
        return hw
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        from generated.dispatch import target_name  # the built tree's own detection
    except ImportError as exc:
        raise TuneError(f"--hw auto needs the built generated/ package and torch ({exc}); pass --hw NAME") from None
    try:
        import torch

        if not torch.cuda.is_available():
            raise TuneError("--hw auto: no GPU is visible here; pass --hw NAME (the interpreter runs on the CPU)")
    except ImportError:
        raise TuneError("--hw auto needs torch") from None
    return target_name(None)


def plan_args(args: argparse.Namespace) -> dict[str, Any]:
    """What, besides the specs, decides the plan: stored in each results file's header so that
    ``merge`` re-plans the same tune."""
    return {
        "shapes": args.shapes,
        "space": args.space,
        "buckets": args.buckets,
        "rounds": args.rounds,
        "chunk": args.chunk,
        "model": args.model,
        "dtype": args.dtype,
    }


def make_plan(tree: SpecTree, kernel: str, target: str, pa: dict[str, Any], budget: float | None) -> Plan:
    space = None
    if pa.get("space"):
        try:
            cfg = tree.config(kernel)
        except KeyError:
            raise PlanError(f"no kernel config {kernel!r}") from None
        if cfg.tune is None:
            raise PlanError(f"{kernel} declares no [{kernel}.tune] table, so it cannot be tuned")
        space = cli_space(cfg, pa["space"], pa.get("buckets"))
    elif pa.get("buckets"):
        raise TuneError("--buckets goes with --space")
    return plan(
        tree,
        kernel,
        target,
        shapes=_shapes(pa.get("shapes")),
        space=space,
        model=pa.get("model"),
        dtype=pa.get("dtype"),
        chunk=pa.get("chunk"),
        rounds=pa.get("rounds"),
        budget_s=int(budget) if budget else None,
    )


def _describe(p: Plan, out: TextIO) -> None:
    n = sum(len(b.candidates) for b in p.buckets)
    r = sum(len(b.rejected) for b in p.buckets)
    print(
        f"tune {p.config} on {p.target} ({p.policy}), {p.dtype}: {len(p.buckets)} bucket(s), {n} candidates in "
        f"{len(p.chunks)} chunks ({r} more failed the spec's checks and are never launched), plan {p.fingerprint}",
        file=out,
    )
    for b in p.buckets:
        shapes = ", ".join(p.shape_text(s) for s in b.shapes)
        print(f"  {b.name}: {shapes}; {len(b.candidates)} candidates, {len(b.rejected)} rejected", file=out)
    if p.idle:
        print(f"  not tuned (no shape falls in them): {', '.join(p.idle)}", file=out)


# -- measuring ------------------------------------------------------------------------------


def _results_dir(args: argparse.Namespace, root: Path, p: Plan) -> Path:
    base = args.results if args.results is not None else root / RESULTS_DIR
    return base / f"{p.config}-{p.target}-{p.fingerprint}"


def _header(p: Plan, i: int, n: int, command: str, pa: dict[str, Any]) -> dict[str, Any]:
    from .measure import shard_header

    h = dict(shard_header(p, i, n, command))
    h["plan_args"] = pa
    return h


def _measure_shard(
    p: Plan, i: int, n: int, path: Path, budget: float, fresh: bool, command: str, pa: dict, quiet: bool, err: TextIO
) -> ResultsFile:
    from .measure import Shard

    try:
        rf = ResultsFile.open(path, _header(p, i, n, command, pa), fresh=fresh)
        rf.check_plan(p)
    except ResultsError as exc:
        hint = "" if "--fresh" in str(exc) else "\n(resuming it: pass --fresh to measure again from the start)"
        raise ResultsError(f"{exc}{hint}") from None
    if rf.dropped:
        why = rf.dropped[0][1]
        print(
            f"{path}: measuring {len(rf.dropped)} chunk(s) again, whose incumbent failed on every shape "
            f"({' '.join(why.split())[:200]})",
            file=err,
        )
    shard = Shard(p, i, n, rf, budget)
    pending = shard.pending()
    done_before = len(p.shard(i, n)) - len(pending)
    if done_before:
        print(f"resuming {path}: {done_before} chunk(s) already measured", file=err)
    with _Progress(p, len(p.shard(i, n)), done_before, quiet, err) as bar:
        summary = shard.run(progress=lambda chunk, line: bar.advance(chunk, line))
    if summary["left"]:
        print(
            f"budget reached: {summary['left']} chunk(s) of shard {i}/{n} not measured; run the same command "
            "again to resume",
            file=err,
        )
    return rf


def _devices(args: argparse.Namespace) -> list[str]:
    if args.devices:
        return [d.strip() for d in args.devices.split(",") if d.strip()]
    try:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        count = 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [d.strip() for d in visible.split(",")] if visible else [str(i) for i in range(count)]
    return ids[:count] if count else ["cpu"]


def _workers(
    p: Plan, args: argparse.Namespace, root: Path, devices: list[str], folder: Path, budget: float, err: TextIO
) -> list[ResultsFile]:
    """One ``tune --shard i/n`` process per device, pinned with CUDA_VISIBLE_DEVICES; progress
    from their results files."""
    n = len(devices)
    procs = []
    paths = [folder / f"shard-{i}-of-{n}.jsonl" for i in range(n)]
    logs = []
    for i, dev in enumerate(devices):
        cmd = [sys.executable, "-m", "codegen", "--root", str(root), "tune", p.config, "--hw", p.target]
        cmd += ["--shard", f"{i}/{n}", "--results", str(paths[i]), "--budget", str(budget), "--quiet"]
        for flag in ("shapes", "space", "buckets"):
            if getattr(args, flag):
                cmd += [f"--{flag}", *getattr(args, flag)]
        for flag in ("rounds", "chunk", "model", "dtype"):
            if getattr(args, flag) is not None:
                cmd += [f"--{flag}", str(getattr(args, flag))]
        if args.fresh:
            cmd.append("--fresh")
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=dev)
        log = open(folder / f"shard-{i}-of-{n}.log", "w")
        logs.append(log)
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
    print(f"{n} workers on devices {', '.join(devices)}; logs in {folder}", file=err)
    total = len(p.chunks)
    with _Progress(p, total, 0, args.quiet, err) as bar:
        while any(proc.poll() is None for proc in procs):
            time.sleep(0.5)
            bar.poll(paths)
        bar.poll(paths)
    for log in logs:
        log.close()
    failed = [(i, proc.returncode) for i, proc in enumerate(procs) if proc.returncode != 0]
    if failed:
        tails = []
        for i, code in failed:
            text = (folder / f"shard-{i}-of-{n}.log").read_text()[-2000:]
            tails.append(f"worker {i} (device {devices[i]}) exited {code}:\n{text}")
        raise TuneError("\n".join(tails))
    return [results_mod.read(path) for path in paths]


class _Progress:
    """A rich progress bar over chunks: the bucket, the best ratio so far, ETA; nothing when quiet."""

    def __init__(self, p: Plan, total: int, done: int, quiet: bool, err: TextIO):
        self.p = p
        self.total = total
        self.done = done
        self.quiet = quiet
        self.err = err
        self.best: dict[str, float] = {}
        self.seen: set[int] = set()

    def __enter__(self) -> "_Progress":
        if not self.quiet:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("chunks"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[best]}"),
                console=Console(file=self.err),
            )
            self.bar.__enter__()
            self.task = self.bar.add_task(
                f"tune {self.p.config}", total=self.total, completed=self.done, best="best: -"
            )
        return self

    def advance(self, chunk: Any, line: dict) -> None:
        self.seen.add(line["index"])
        for entry in line["shapes"].values():
            for key, res in entry.get("candidates", {}).items():
                if "vs_incumbent" in res:
                    self.best[line["bucket"]] = max(self.best.get(line["bucket"], 0.0), res["vs_incumbent"])
        if not self.quiet:
            best = " ".join(f"{b} {r:.3f}x" for b, r in self.best.items())
            self.bar.update(
                self.task, advance=1, description=f"tune {self.p.config}: {line['bucket']}", best=f"best: {best}"
            )

    def poll(self, paths: list[Path]) -> None:
        for path in paths:
            if not path.exists():
                continue
            try:
                rf = results_mod.read(path)
            except ResultsError:
                continue
            for index, line in rf.chunks.items():
                if index not in self.seen:
                    self.advance(None, line)

    def __exit__(self, *exc: Any) -> None:
        if not self.quiet:
            self.bar.__exit__(*exc)


# -- the commands ---------------------------------------------------------------------------


def _load(root: Path) -> SpecTree:
    res = pipeline.run(root, until="tree_to_resolution")  # the tree must build before it is tuned
    return res.tree


def _tune(args: argparse.Namespace, root: Path, argv: Sequence[str], out: TextIO, err: TextIO) -> int:
    t0 = time.monotonic()
    tree = _load(root)
    target = _target(tree, args.hw, root)
    if args.model is not None and args.model not in tree.models:
        raise TuneError(f"--model {args.model}: no such model spec (known: {', '.join(sorted(tree.models))})")
    if not args.plan:
        devices = [d.strip() for d in args.devices.split(",")] if args.devices else None
        if target in {h.name for h in tree.hardware}:  # an unknown name: the plan says so
            _device_here(tree, target, root, devices)
    pa = plan_args(args)
    p = make_plan(tree, args.kernel, target, pa, args.budget)
    _describe(p, out)
    if args.plan:
        return EXIT_OK
    if args.dry_run:  # measure into a temporary folder (seeded with earlier results): write nothing
        with tempfile.TemporaryDirectory(prefix="codegen-tune-") as tmp:
            real = _results_dir(args, root, p)
            scratch = Path(tmp) / real.name
            if real.is_dir() and not args.fresh:
                shutil.copytree(real, scratch, ignore=shutil.ignore_patterns("*.log"))
            return _tune_into(tree, p, scratch, args, root, argv, out, err, t0)
    return _tune_into(tree, p, _results_dir(args, root, p), args, root, argv, out, err, t0)


def _tune_into(
    tree: SpecTree,
    p: Plan,
    folder: Path,
    args: argparse.Namespace,
    root: Path,
    argv: Sequence[str],
    out: TextIO,
    err: TextIO,
    t0: float,
) -> int:
    pa = plan_args(args)
    command = "python -m codegen " + " ".join(shlex.quote(a) for a in argv)
    budget = float(args.budget if args.budget is not None else p.budget_s)
    if args.shard:
        i, n = _shard(args.shard)
        path = args.results if args.results is not None and args.results.suffix == ".jsonl" else None
        path = path or folder / f"shard-{i}-of-{n}.jsonl"
        rf = _measure_shard(p, i, n, path, budget, args.fresh, command, pa, args.quiet, err)
        print(f"shard {i}/{n}: {len(rf.chunks)} of {len(p.shard(i, n))} chunks measured; results in {path}", file=out)
        return EXIT_OK
    devices = _devices(args)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TuneError(f"cannot create the results folder {folder}: {exc.strerror or exc}") from None
    if len(devices) > 1:
        files = _workers(p, args, root, devices, folder, budget, err)
        for rf in files:
            rf.check_plan(p)
    else:
        path = folder / "shard-0-of-1.jsonl"
        files = [_measure_shard(p, 0, 1, path, budget, args.fresh, command, pa, args.quiet, err)]
    merged = results_mod.merge(files)
    code = _conclude(tree, p, merged, args, root, command, out, err)
    print(f"tune wall time {time.monotonic() - t0:.1f} s on {len(devices)} worker(s)", file=out)
    return code


def _merge(args: argparse.Namespace, root: Path, argv: Sequence[str], out: TextIO, err: TextIO) -> int:
    if not args.files:
        raise TuneError("merge: give the results files of the shards")
    _check_merge_options(args)
    files, problems = [], []
    for f in args.files:
        try:
            files.append(results_mod.read(Path(f)))
        except ResultsError as exc:
            problems.append(str(exc))
    if problems:
        raise ResultsError("\n".join(problems))
    merged = results_mod.merge(files)
    tree = _load(root)
    h = files[0].header
    try:
        p = make_plan(tree, h["config"], h["target"], h["plan_args"], None)
    except (PlanError, TuneError) as exc:
        raise TuneError(
            f"{files[0].path}:1: its header's tune ({h['config']} on {h['target']}) cannot be planned on these "
            f"specs: {exc}"
        ) from None
    if p.fingerprint != merged.fingerprint:
        names = ", ".join(str(f.path) for f in files)
        raise TuneError(
            f"{names}: the specs changed since these results were measured (their plan {merged.fingerprint}, these "
            f"specs give {p.fingerprint}): merge on the tree the tune ran on"
        )
    for f in files:
        f.check_plan(p)
    counts = {tuple(f.header["shard"])[1] for f in files}
    if len(counts) == 1:
        n = counts.pop()
        missing = sorted(set(range(n)) - {f.header["shard"][0] for f in files})
        if missing:
            print(f"merge: no results for shard(s) {', '.join(map(str, missing))} of {n}", file=err)
    _describe(p, out)
    command = h.get("command", "python -m codegen tune") + f" (merged from {len(files)} results file(s))"
    return _conclude(tree, p, merged, args, root, command, out, err)


def _conclude(
    tree: SpecTree, p: Plan, merged: Any, args: argparse.Namespace, root: Path, command: str, out: TextIO, err: TextIO
) -> int:
    verdicts = decide(p, merged)
    env = merged.headers[0]["env"]
    _summary(p, verdicts, merged, out)
    date = time.strftime("%Y-%m-%d", time.gmtime())
    found = edits(tree, p, verdicts, env=env, date=date, command=command, scope=args.scope)
    if not found:
        held = all(v.best is not None and not v.incumbent_failed for v in verdicts)
        print("no spec changes: " + ("the incumbents held" if held else "see the table"), file=out)
        return EXIT_OK
    outs = _verify(root, found)
    if args.dry_run:
        for e in found:
            out.write(
                "".join(
                    difflib.unified_diff(
                        e.before.splitlines(True), e.after.splitlines(True), fromfile=e.path, tofile=e.path
                    )
                )
            )
        return EXIT_OK
    built = write_back(root, found, [] if args.no_build else outs)
    for e in found:
        print(f"wrote {e.path}", file=out)
    if args.no_build:
        print("specs written; run `python -m codegen build` to regenerate generated/", file=out)
        return EXIT_OK
    pipeline.report(built, out)
    return EXIT_OK


def write_back(root: Path, found: list[Edit], outs: list[pipeline.Output]) -> list:
    """The edited specs and what they build (``outs``: generated/ and schemas/, none with
    --no-build) written as one transaction under the tree's build lock (``pipeline.build``): the
    spec files are renamed into place first, so a tune killed at any moment leaves either the
    old specs and outputs, or the new specs (which the next build makes generated/ agree with).
    A spec file changed since tune read it is not overwritten."""
    specs = root / "specs"
    changes = []
    for e in found:
        rel = Path(e.path).relative_to("specs").as_posix()
        changes.append(write.Change(rel, "update", e.before.encode(), e.after.encode()))
    leftovers = []  # temporary files of a write-back that was killed, removed once this one is done
    for change in changes:
        target = specs / change.path
        for tmp in sorted(target.parent.glob(f".{target.name}.*.tmp")):
            match = write.TEMP_RE.match(tmp.name)
            if match is not None and match["target"] == target.name and tmp.is_file():
                leftovers.append(tmp.relative_to(specs).as_posix())
    plan = write.Plan(specs, tuple(changes), (), (), tuple(leftovers))

    def unchanged_specs() -> None:
        for e, change in zip(found, changes):
            try:
                now = (specs / change.path).read_bytes()
            except OSError as exc:
                raise WriteBackError(f"cannot read {e.path}: {exc.strerror or exc}; nothing written") from None
            if now != change.old:
                raise WriteBackError(
                    f"{e.path} changed while tune ran; nothing written: run the same command again to decide "
                    "from the results measured so far"
                )

    return pipeline.build(root, outs, before=[plan], check=unchanged_specs)


def _verify(root: Path, found: list[Edit]) -> list[pipeline.Output]:
    """The edited specs must build: resolve and render a copy of the tree with them; what
    they build (generated/ and schemas/ of the root, once the edits are in)."""
    with tempfile.TemporaryDirectory(prefix="codegen-tune-") as tmp:
        copy = Path(tmp)
        shutil.copytree(root / "specs", copy / "specs")
        if (root / "templates").is_dir():
            shutil.copytree(root / "templates", copy / "templates")
        for e in found:
            (copy / e.path).write_bytes(e.after.encode())
        try:
            res = pipeline.run(copy, until="tree_to_resolution")
            return pipeline.outputs(res, "build")
        except SpecErrors as exc:
            lines = "\n  ".join(pr.render() for pr in exc.problems)
            raise WriteBackError(f"the written specs would not build (nothing written):\n  {lines}") from None


def _summary(p: Plan, verdicts: tuple[Verdict, ...], merged: Any, out: TextIO) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"codegen tune {p.config} on {p.target} ({merged.headers[0]['env'].get('device', '?')})")
    for col in (
        "bucket",
        "shapes",
        "measured",
        "failed",
        "not run",
        "best vs current",
        "spread",
        "vs library",
        "result",
    ):
        t.add_column(col)
    for v in verdicts:
        if v.incumbent_failed:
            result = f"incumbent failed: {v.incumbent_failed}"
        elif v.winner is not None:
            result = "new: " + " ".join(f"{k}={_fmt(x)}" for k, x in changes(p, v).items())
        elif v.backend is not None:
            result = f"backend -> {v.backend}"
        elif v.best is None:
            result = "nothing measured"
        else:
            result = "incumbent held"
        t.add_row(
            v.bucket,
            ", ".join(v.shapes),
            f"{v.measured}/{v.planned}",
            str(len(v.failed)),
            str(v.unmeasured),
            f"{v.best_score:.3f}x" if v.best_score is not None else "-",
            f"{v.spread:.1%}" if v.spread is not None else "-",
            f"{v.kernel_vs_library:.3f}x" if v.kernel_vs_library is not None else "-",
            result,
        )
    Console(file=out, width=160).print(t)
    for v in verdicts:
        for label, why in v.failed[:5]:
            print(f"  disqualified in {v.bucket}: {label}: {why}", file=out)
        if len(v.failed) > 5:
            print(f"  ... and {len(v.failed) - 5} more disqualified in {v.bucket}", file=out)


def _fmt(v: Any) -> str:
    if isinstance(v, dict):
        return "{" + str(v.get("expr")) + "}"
    return str(v)
