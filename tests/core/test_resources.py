"""What memory there is (:mod:`fvlib.resources`): the smallest of the machine's available RAM,
what ``ulimit -v`` leaves and what the cgroup leaves; and the refusal of work that cannot fit."""

import math
import re
import resource
from pathlib import Path

import pytest
import torch

from fvlib import resources
from fvlib._checks import check_finite


@pytest.mark.parametrize("files, left", [
    ({"memory.max": "1000000000\n", "memory.current": "300000000\n"}, 7e8),
    ({"memory.max": "max\n", "memory.current": "300000000\n"}, math.inf),
    ({"memory/memory.limit_in_bytes": "2000000000\n", "memory/memory.usage_in_bytes": "500000000\n"}, 1.5e9),
    ({"memory/memory.limit_in_bytes": "9223372036854771712\n"}, math.inf),  # v1 without a limit
    ({"memory.max": "100\n", "memory.current": "300\n"}, 0.0),
    ({}, math.inf),
], ids=["v2", "v2-max", "v1", "v1-unlimited", "v2-over", "none"])
def test_cgroup_memory_left_reads_v1_and_v2(tmp_path, files, left):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert resources.cgroup_memory_left(tmp_path) == left


def test_address_space_left_is_the_limit_less_what_is_mapped():
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        pytest.skip("this process already runs under an address-space limit")
    limit = 200 * 10**9  # far above what the test maps: nothing here can hit it
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        left = resources.address_space_left()
        mapped = float(re.search(r"VmSize:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    assert left == pytest.approx(limit - mapped, rel=1e-3)
    assert resources.address_space_left() == math.inf


def test_available_memory_is_the_smallest_source(monkeypatch):
    monkeypatch.setattr(resources, "physical_memory_available", lambda: 8e9)
    monkeypatch.setattr(resources, "cgroup_memory_left", lambda: math.inf)
    monkeypatch.setattr(resources, "address_space_left", lambda: 2.5e9)
    assert resources.available_memory() == 2.5e9
    monkeypatch.setattr(resources, "cgroup_memory_left", lambda: 1e9)
    assert resources.available_memory() == 1e9
    assert resources.available_memory(torch.device("cpu")) == 1e9


def test_physical_memory_available_is_at_most_the_ram():
    ram = resources.os.sysconf("SC_PAGE_SIZE") * resources.os.sysconf("SC_PHYS_PAGES")
    assert 0 < resources.physical_memory_available() <= ram


def test_check_fits_names_the_argument(monkeypatch):
    monkeypatch.setattr(resources, "available_memory", lambda device=None: 2e9)
    assert resources.check_fits("batch", 7, 1.9e9) == 7
    with pytest.raises(ValueError, match=r"^batch = 7 would need about 2\.1 GB of memory, more than the 2 GB there is"):
        resources.check_fits("batch", 7, 2.1e9)


def test_check_fits_does_not_read_the_limits_for_a_small_request(monkeypatch):
    def never(device=None):
        raise AssertionError("the limits were read for a request under UNCHECKED_BYTES")

    monkeypatch.setattr(resources, "available_memory", never)
    assert resources.check_fits("batch", 3, resources.UNCHECKED_BYTES - 1) == 3


@pytest.mark.parametrize("nbytes, text", [(2.4e12, "2.4 TB"), (1.93e10, "19.3 GB"), (3.36e7, "33.6 MB")])
def test_format_bytes(nbytes, text):
    assert resources.format_bytes(nbytes) == text


def test_check_finite_finds_every_non_finite_value():
    x = torch.zeros(3, 4)
    assert check_finite("x", x) is x
    x[0, 1], x[2, 3] = float("inf"), float("nan")
    with pytest.raises(ValueError, match=r"^x must be finite, got 2 NaN or infinite value\(s\)$"):
        check_finite("x", x)
    big = torch.full((4,), 3e38)  # finite values whose sum overflows
    assert check_finite("big", big) is big
