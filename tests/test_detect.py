"""detect_hardware: device name first, then arch, then the nearest lower arch with a warning."""

import warnings

import pytest

from generated.dispatch import HARDWARE, detect_hardware


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
        ("nvidia", (9, 0), "NVIDIA H800", "h100"),  # same arch, unknown name: the arch's first spec
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
    with pytest.raises(RuntimeError, match="unknown vendor 'amd'"):
        detect_hardware("amd", (9, 4), "AMD Instinct MI300X")
    with pytest.raises(RuntimeError, match="below every nvidia spec"):
        detect_hardware("nvidia", (7, 0), "Tesla V100-SXM2-16GB")


def test_no_device_is_a_clear_error():
    import torch

    if torch.cuda.is_available():
        assert detect_hardware() in HARDWARE
    else:
        with pytest.raises(RuntimeError, match="no GPU device is available"):
            detect_hardware()
