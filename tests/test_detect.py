"""detect_hardware: device name first (any vendor), then arch with a warning, then the nearest lower arch.

The device tests fake torch.cuda's device queries, so they run on the CPU.
"""

import warnings
from types import SimpleNamespace

import pytest

import generated.dispatch as D
from generated.dispatch import HARDWARE, detect_hardware, target_name


@pytest.mark.parametrize(
    "vendor, capability, name, expected",
    [
        ("nvidia", (9, 0), "NVIDIA H200", "h200"),
        ("nvidia", (9, 0), "NVIDIA H100 80GB HBM3", "h100"),
        ("nvidia", (8, 0), "NVIDIA A100-SXM4-80GB", "a100"),
        ("nvidia", (8, 6), "NVIDIA A10", "a10"),  # "A10" must not match "A100" or vice versa
        ("nvidia", (8, 9), "NVIDIA L40S", "l40s"),
        ("nvidia", (10, 0), "NVIDIA B200", "b200"),
        ("nvidia", (12, 0), "NVIDIA GeForce RTX 5090", "rtx5090"),
        ("nvidia", (12, 1), "NVIDIA GB10", "gb10"),
        ("iluvatar", (10, 0), "Iluvatar BI-V100", "bi_v100"),
    ],
)
def test_exact_matches_do_not_warn(vendor, capability, name, expected):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert detect_hardware(vendor, capability, name) == expected


def test_unknown_arch_chains_to_nearest_lower_arch_of_the_same_vendor_with_a_warning():
    with pytest.warns(RuntimeWarning, match=r"nvidia arch 87 .*using 'a10' \(arch 86\)"):
        assert detect_hardware("nvidia", (8, 7), "NVIDIA Jetson AGX Orin") == "a10"
    with pytest.warns(RuntimeWarning, match="using 'b200'"):
        assert detect_hardware("nvidia", (10, 3), "NVIDIA B300") == "b200"


def test_iluvatar_never_chains_to_nvidia():
    with pytest.raises(RuntimeError, match="below every iluvatar spec"):
        detect_hardware("iluvatar", (7, 1), "Iluvatar MR-V50")


def test_unknown_vendor_and_arch_below_every_spec_are_errors():
    # Each names what the user can do about it: a spec for the part, or another part's by hw=.
    fix = r"Add a spec for this part \(specs/hardware/<name>.toml, then `python -m codegen build`\), or pass hw="
    with pytest.raises(RuntimeError, match=f"unknown vendor 'intel'.*{fix}"):
        detect_hardware("intel", (12, 0), "Intel Data Center GPU Max 1550")
    with pytest.raises(RuntimeError, match=f"below every nvidia spec.*{fix}"):
        detect_hardware("nvidia", (7, 0), "Tesla V100-SXM2-16GB")


def test_no_device_is_a_clear_error():
    import torch

    if torch.cuda.is_available():
        assert detect_hardware() in HARDWARE
    else:
        with pytest.raises(RuntimeError, match="no GPU device is available"):
            detect_hardware()


@pytest.mark.parametrize(
    "vendor, capability, name, expected",
    [
        ("nvidia", (8, 0), "NVIDIA A30", "a100"),  # 56 SMs against a100's 108
        ("nvidia", (9, 0), "NVIDIA H20", "h100"),  # 78 against 132
        ("nvidia", (8, 9), "NVIDIA L4", "l40s"),  # 58 against 142
        ("nvidia", (9, 0), "NVIDIA H800", "h100"),
    ],
)
def test_arch_only_match_warns_naming_the_device_the_spec_and_why(vendor, capability, name, expected):
    with pytest.warns(RuntimeWarning, match=rf"{name!r}.*{expected!r}.*matched by arch only") as record:
        assert detect_hardware(vendor, capability, name) == expected
    assert len(record) == 1
    assert f"specs/hardware/{expected}.toml" in str(record[0].message)


def test_name_patterns_match_across_vendors_before_the_vendor_is_inferred():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # The vendor comes from the matched spec, whatever vendor the caller guessed.
        assert detect_hardware("nvidia", (10, 0), "BI-V100") == "bi_v100"
        assert detect_hardware(None, (10, 0), "BI-V100") == "bi_v100"


def test_name_without_vendor_infers_it():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert detect_hardware(name="NVIDIA H200") == "h200"
        assert detect_hardware(name="BI-V100") == "bi_v100"
        assert detect_hardware(name="Iluvatar BI-V100") == "bi_v100"
    with pytest.warns(RuntimeWarning, match="matched by arch only"):
        assert detect_hardware(capability=(8, 0), name="NVIDIA A30") == "a100"
    with pytest.raises(RuntimeError, match=r"'NVIDIA A30' matches no spec's device_names.*no capability"):
        detect_hardware(name="NVIDIA A30")
    with pytest.raises(RuntimeError, match="below every iluvatar spec"):
        detect_hardware(capability=(7, 1), name="Iluvatar MR-V50")
    # An AMD name is AMD's (specs/vendors/amd.toml name_words), whose arch needs the gfx name.
    with pytest.raises(RuntimeError, match="no gfx arch name"):
        detect_hardware(capability=(9, 4), name="AMD Instinct MI308X")
    with pytest.raises(RuntimeError, match="no vendor and no device name"):
        detect_hardware(capability=(9, 0))


# Fake devices: (name, (major, minor), multi_processor_count).
H200 = ("NVIDIA H200", (9, 0), 132)
H100_SXM = ("NVIDIA H100 80GB HBM3", (9, 0), 132)
H100_PCIE = ("NVIDIA H100 PCIe", (9, 0), 114)
A30 = ("NVIDIA A30", (8, 0), 56)
BI_V100 = ("BI-V100", (10, 0), 16)


@pytest.fixture
def fake_gpus(monkeypatch):
    """fake_gpus(dev0, dev1, ...): torch.cuda reports these devices; detection starts uncached."""
    torch = pytest.importorskip("torch")
    devices: list = []
    queried: list = []

    def dev(index):
        assert isinstance(index, int) and not isinstance(index, bool), f"device queried with {index!r}"
        queried.append(index)
        return devices[index]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(devices))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: dev(index)[0])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: dev(index)[1])
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda index=None: SimpleNamespace(
            name=dev(index)[0], major=dev(index)[1][0], minor=dev(index)[1][1], multi_processor_count=dev(index)[2]
        ),
    )
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(D._DETECTOR, "detected", {})

    def install(*devs):
        devices[:] = devs
        return queried

    return install


def cuda(index):
    import torch

    return torch.device("cuda", index)


def _detect_recording(fn, *args, **kwargs):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        result = fn(*args, **kwargs)
    return result, [str(w.message) for w in record if issubclass(w.category, RuntimeWarning)]


def test_h200_device_is_detected_without_warnings(fake_gpus):
    fake_gpus(H200)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert target_name() == "h200"
        assert detect_hardware() == "h200"
        assert HARDWARE["h200"].sm_count == H200[2]


def test_sm_count_mismatch_warns_once_per_device(fake_gpus):
    fake_gpus(H100_PCIE, H100_PCIE, H100_SXM)
    name, messages = _detect_recording(target_name, None, cuda(0))
    assert name == "h100"
    assert len(messages) == 1, messages
    assert "114" in messages[0] and "132" in messages[0] and "specs/hardware/h100.toml" in messages[0]
    assert "NVIDIA H100 PCIe" in messages[0]
    assert _detect_recording(target_name, None, cuda(0)) == ("h100", [])  # cached: no second warning
    assert _detect_recording(detect_hardware) == ("h100", [])  # the current device is index 0
    name, messages = _detect_recording(target_name, None, cuda(1))  # another device warns for itself
    assert name == "h100" and len(messages) == 1 and "cuda:1" in messages[0]
    assert _detect_recording(target_name, None, cuda(2)) == ("h100", [])  # 132 SMs: as the spec says


def test_arch_only_device_warns_once_per_device_with_its_sm_count(fake_gpus):
    fake_gpus(A30, A30)
    name, messages = _detect_recording(target_name, None, cuda(0))
    assert name == "a100"
    assert len(messages) == 2, messages
    assert any("'NVIDIA A30'" in m and "'a100'" in m and "matched by arch only" in m for m in messages)
    assert any("56" in m and "108" in m and "specs/hardware/a100.toml" in m for m in messages)
    assert _detect_recording(target_name, None, cuda(0)) == ("a100", [])
    name, messages = _detect_recording(target_name, None, cuda(1))
    assert name == "a100" and len(messages) == 2


def test_device_named_like_an_other_vendors_spec_is_name_matched(fake_gpus):
    fake_gpus(BI_V100)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert target_name() == "bi_v100"  # not nvidia arch 100 (b200)


def test_target_name_normalises_string_int_and_torch_devices(fake_gpus):
    import torch

    queried = fake_gpus(H200, H100_SXM)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert target_name(device="cuda:1") == "h100"
        assert target_name(device=1) == "h100"
        assert target_name(device=torch.device("cuda", 1)) == "h100"
        assert target_name(device="cuda") == "h200"  # no index: the current device
        assert target_name(device=torch.device("cuda:0")) == "h200"
    assert sorted(D._DETECTOR.detected) == [0, 1]  # one cache entry per device index
    assert set(queried) == {0, 1}
    n = len(queried)
    target_name(device="cuda:1")
    assert len(queried) == n  # cached
    with pytest.raises(RuntimeError, match="pass hw="):
        target_name(device="cpu")
    with pytest.raises(RuntimeError, match="pass hw="):
        target_name(device=torch.device("cpu"))
    with pytest.raises(TypeError, match="device"):
        target_name(device=1.5)
    assert target_name("h200", device="cpu") == "h200"  # hw wins: nothing is detected


# ---------------------------------------------------------------------------------------------
# Vendors are data (specs/vendors/): AMD's arch comes from the gfx target, not the capability.


def test_amd_arch_comes_from_the_gfx_target_name():
    from policy_runtime.detect import arch_number

    amd = D.VENDORS["amd"]
    assert arch_number(amd, (9, 4), "gfx942:sramecc+:xnack-") == 942
    assert arch_number(amd, None, "gfx90a") == 910
    assert arch_number(amd, (9, 4), None) is None  # ROCm's (9, 4) says nothing of 942
    assert arch_number(D.VENDORS["nvidia"], (9, 0), "gfx942") == 90


def test_mi300x_is_detected_by_name_and_by_gfx_arch():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert detect_hardware(name="AMD Instinct MI300X") == "mi300x"
    assert HARDWARE["mi300x"].arch_version == 942 and HARDWARE["mi300x"].warp_size == 64
    with pytest.warns(RuntimeWarning, match="matched by arch only"):
        assert detect_hardware(name="AMD Instinct MI325X", arch_name="gfx942") == "mi300x"
    with pytest.warns(RuntimeWarning, match="nearest lower arch"):
        assert detect_hardware("amd", name="AMD Instinct MI355X", arch_name="gfx950") == "mi300x"
    with pytest.raises(RuntimeError, match="no gfx arch name"):
        detect_hardware("amd", (9, 4), "AMD Instinct MI325X")


def test_mi300x_is_served_by_base_policies():
    from generated.dispatch import dispatch_kernel_config

    attention = dispatch_kernel_config("attention_fp16", "mi300x")
    # 64 KiB LDS, no async copy (one stage): 64 rows of K and V at head_dim 256 x 2 B fill it.
    assert attention.triton_block_n == 64 and attention.triton_num_stages == 1
    assert not attention.use_native_v1 and not attention.use_native_v2
    assert dispatch_kernel_config("rms_norm", "mi300x").warp_size == 64


def test_a_rocm_device_is_detected_through_its_gfx_arch(fake_gpus, monkeypatch):
    import torch

    fake_gpus(("AMD Instinct MI325X", (9, 4), 304))
    monkeypatch.setattr(torch.version, "hip", "6.2")
    props = torch.cuda.get_device_properties

    def with_gfx(index=None):
        p = props(index)
        p.gcnArchName = "gfx942:sramecc+:xnack-"
        return p

    monkeypatch.setattr(torch.cuda, "get_device_properties", with_gfx)
    name, messages = _detect_recording(target_name, device=0)
    assert name == "mi300x"
    assert any("matched by arch only" in m for m in messages)
