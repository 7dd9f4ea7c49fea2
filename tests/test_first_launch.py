"""policy_runtime/launch.py: the setup before a process's first compiled Triton launch.

Triton's driver and its cache key are real only on a GPU machine, so these tests put fakes in
their places (Triton's lazy ``driver.active`` and ``triton.runtime.cache.triton_key``) and check
what _ready_triton promises: the two steps run at the same time, in two threads; once per
process; failures are left for the launch to raise; nothing in the interpreter; and both kernel
families' launch paths call it (every memory-bound kernel of generated/transform.py and
generated/cache.py, and matmul).  Its speed is measured by bench/matmul.py's first-call rows.
"""

from __future__ import annotations

import threading

import pytest
import torch
import triton
import triton.runtime.cache

from policy_runtime import launch
from generated import cache as cache_ops
from generated import matmul as mm
from generated import transform as transform_ops

WAIT_S = 10.0


class FakeDriver:
    """Triton's active driver, whose initialisation is get_current_target's first call."""

    def __init__(self, step):
        self.step = step

    def get_current_target(self):
        return self.step()


@pytest.fixture
def compiled_process(monkeypatch):
    """A process that has launched no compiled kernel yet: the flag up, the interpreter off."""
    monkeypatch.setattr(launch, "INTERPRET", False)
    monkeypatch.setattr(launch, "FIRST_LAUNCH", True)

    def install(driver_step, key_step):
        monkeypatch.setattr(triton.runtime.driver, "_active", FakeDriver(driver_step))
        monkeypatch.setattr(triton.runtime.cache, "triton_key", key_step)

    return install


def test_driver_and_cache_key_overlap(compiled_process):
    # Each step waits for the other to have started: run one after the other, in one thread,
    # the first would time out without seeing the second.
    driver_started, key_started = threading.Event(), threading.Event()
    seen = {}

    def driver_step():
        driver_started.set()
        seen["driver saw key"] = key_started.wait(WAIT_S)
        seen["driver thread"] = threading.current_thread()

    def key_step():
        key_started.set()
        seen["key saw driver"] = driver_started.wait(WAIT_S)
        seen["key thread"] = threading.current_thread()

    compiled_process(driver_step, key_step)
    launch.ready_triton()
    assert seen["driver saw key"] and seen["key saw driver"]
    assert seen["driver thread"] is threading.main_thread()
    assert seen["key thread"] is not threading.main_thread()
    assert launch.FIRST_LAUNCH is False
    # The key's thread has finished when the setup returns: the launch finds the key computed.
    assert not any(t.name == "triton_key" for t in threading.enumerate())


def test_failures_are_left_to_the_launch(compiled_process):
    calls = []

    def fail(name):
        def step():
            calls.append(name)
            raise RuntimeError(f"{name} failed")

        return step

    compiled_process(fail("driver"), fail("key"))
    launch.ready_triton()  # raises nothing: Triton raises its own error at the launch
    assert sorted(calls) == ["driver", "key"]
    assert launch.FIRST_LAUNCH is False


def test_interpreter_does_no_setup(compiled_process, monkeypatch):
    calls = []
    compiled_process(lambda: calls.append("driver"), lambda: calls.append("key"))
    monkeypatch.setattr(launch, "INTERPRET", True)
    launch.ready_triton()
    assert calls == [] and launch.FIRST_LAUNCH is False


class CountingSetup:
    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1
        launch.FIRST_LAUNCH = False


def test_memory_bound_launch_path_sets_up_once(monkeypatch):
    setup = CountingSetup()
    monkeypatch.setattr(launch, "ready_triton", setup)
    monkeypatch.setattr(launch, "FIRST_LAUNCH", True)
    launched = []
    monkeypatch.setattr(launch, "launch_kernel", lambda *args, **kwargs: launched.append(setup.calls))
    plan = launch.LaunchPlan(kernel=None, grid=1, consts=(), num_warps=4)
    for _ in range(3):
        launch.run_plan(plan, torch.zeros(1), ())
    assert setup.calls == 1 and launched == [1, 1, 1]  # before the first launch, then never


def test_every_memory_bound_kernel_sets_up_through_the_launch_path(monkeypatch):
    """Each public function of generated/transform.py and generated/cache.py launches through
    launch.run_plan: in a fresh process, its first call sets up once and its second does not."""
    setup = CountingSetup()
    monkeypatch.setattr(launch, "ready_triton", setup)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(3, 64, device=dev)
    kv = torch.randn(3, 2, 8, device=dev)  # [tokens, kv_heads, head_size]
    kc, vc = torch.zeros(4, 2, 2, 8, device=dev), torch.zeros(4, 2, 2, 8, device=dev)
    slots = torch.tensor([0, 3, 5], device=dev)
    calls = {
        "rms_norm": lambda: transform_ops.rms_norm(x, torch.ones(64, device=dev), 1e-6, hw="h200"),
        "silu_and_mul": lambda: transform_ops.silu_and_mul(x, hw="h200"),
        "rotary_embedding": lambda: transform_ops.rotary_embedding(
            torch.zeros(3, dtype=torch.int64, device=dev),
            x.clone(),
            None,
            torch.ones(4, 16, device=dev),
            16,
            True,
            hw="h200",
        ),
        "reshape_and_cache": lambda: cache_ops.reshape_and_cache(kv, kv, kc, vc, slots, hw="h200"),
        "copy_blocks": lambda: cache_ops.copy_blocks([kc], [vc], torch.tensor([[0, 1]], device=dev), hw="h200"),
    }
    for name, call in calls.items():
        monkeypatch.setattr(launch, "FIRST_LAUNCH", True)
        before = setup.calls
        call()
        call()
        assert setup.calls == before + 1, name


def test_matmul_launch_path_sets_up_once(monkeypatch):
    setup = CountingSetup()
    monkeypatch.setattr(launch, "ready_triton", setup)
    monkeypatch.setattr(launch, "FIRST_LAUNCH", True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    a = torch.randn(5, 24, dtype=torch.float32, device=device)
    b = torch.randn(24, 7, dtype=torch.float32, device=device)
    for _ in range(2):
        out = mm.matmul_triton(a, b, hw="h200")
        torch.testing.assert_close(out, a @ b, rtol=1e-4, atol=1e-4)
    assert setup.calls == 1
