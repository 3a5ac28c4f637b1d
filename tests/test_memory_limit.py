"""The memory check reads vLLM's limit, never the sidecar's own: the pod's cgroup (v2) where
the sidecar can see it, less the sidecar's share; else nothing (the manifests then give
--memory-limit / KVOFFLOAD_MEMORY_LIMIT from the Downward API). Fake cgroup trees under
tmp_path stand for what kubelet makes with each cgroup driver."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvoffload.analysis.advisor import read_cgroup_memory_limit
from kvoffload.cli.options import make_settings

GIB = 2**30
SIDECAR = 256 * 2**20
UID = "1d7f3c1e-2b4a-4c5d-8e9f-0a1b2c3d4e5f"
SYSTEMD_POD = (
    f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice"
)
CGROUPFS_POD = f"kubepods/burstable/pod{UID}"


def _tree(root: Path, limits: dict[str, str], own: str) -> Path:
    """cgroup dirs with their memory.max under `root`; returns a /proc/self/cgroup for `own`."""
    for directory, value in limits.items():
        (root / directory).mkdir(parents=True, exist_ok=True)
        (root / directory / "memory.max").write_text(value + "\n")
    self_cgroup = root.parent / "self-cgroup"
    self_cgroup.write_text(f"0::{own}\n")
    return self_cgroup


@pytest.mark.parametrize(
    "pod",
    [SYSTEMD_POD, CGROUPFS_POD],
    ids=["systemd-driver", "cgroupfs-driver"],
)
def test_the_pod_limit_less_the_sidecars_own(tmp_path: Path, pod: str) -> None:
    root = tmp_path / "cgroup"
    own = f"{pod}/cri-containerd-0a1b2c.scope"
    self_cgroup = _tree(
        root, {pod: str(48 * GIB + SIDECAR), own: str(SIDECAR), "kubepods": "max"}, "/" + own
    )
    assert read_cgroup_memory_limit(str(root), str(self_cgroup)) == 48 * GIB


def test_never_the_sidecars_own_limit(tmp_path: Path) -> None:
    """In a cgroup namespace (containerd/CRI-O on cgroup v2) /sys/fs/cgroup is the sidecar's
    own cgroup: 256 MiB there is not vLLM's limit."""
    root = tmp_path / "cgroup"
    self_cgroup = _tree(root, {".": str(SIDECAR)}, "/")
    assert read_cgroup_memory_limit(str(root), str(self_cgroup)) is None


@pytest.mark.parametrize(
    ("limits", "own", "expected"),
    [
        # A container without a limit leaves the pod unlimited.
        ({SYSTEMD_POD: "max", f"{SYSTEMD_POD}/c.scope": str(SIDECAR)}, "c.scope", None),
        # The sidecar without a limit of its own: the pod's is the best bound there is.
        ({SYSTEMD_POD: str(48 * GIB), f"{SYSTEMD_POD}/c.scope": "max"}, "c.scope", 48 * GIB),
        # Not in a pod (docker, a systemd service): the parent's limit is nobody's container.
        ({"system.slice": str(64 * GIB), "system.slice/docker-1.scope": "max"}, None, None),
        # Unreadable or garbled.
        ({SYSTEMD_POD: "lots", f"{SYSTEMD_POD}/c.scope": str(SIDECAR)}, "c.scope", None),
    ],
)
def test_what_is_not_a_pod_limit(
    tmp_path: Path, limits: dict[str, str], own: str | None, expected: float | None
) -> None:
    root = tmp_path / "cgroup"
    path = f"/{SYSTEMD_POD}/{own}" if own else "/system.slice/docker-1.scope"
    self_cgroup = _tree(root, limits, path)
    assert read_cgroup_memory_limit(str(root), str(self_cgroup)) == expected


def test_no_cgroup_v2(tmp_path: Path) -> None:
    v1 = tmp_path / "self-cgroup"
    v1.write_text("12:memory:/kubepods/pod1\n1:name=systemd:/kubepods/pod1\n")
    assert read_cgroup_memory_limit(str(tmp_path), str(v1)) is None
    assert read_cgroup_memory_limit(str(tmp_path), str(tmp_path / "absent")) is None


def test_the_flag_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kvoffload.cli.options.read_cgroup_memory_limit", lambda: 48.0 * GIB)
    assert make_settings(1, None, None).memory_limit_bytes == 48 * GIB
    assert make_settings(1, 16.0 * GIB, None).memory_limit_bytes == 16 * GIB
