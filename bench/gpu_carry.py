"""The Python packages a lent GPU machine lacks, packed into one tarball to carry there.

The device machines (the `device` tool) have no network; their image holds python3 3.12 with
torch on CUDA and many packages, but not EnvPool, ale-py, Gymnasium, stable-baselines3 nor most
of fleetd's daemon side. This installs fleetd's dependency closure, at the versions this venv
has, for the device's Python (`pip install --target --python-version --platform`, binary wheels
only), less what the image already has, prunes EnvPool to the env families the benches use
(Atari and classic control: its MuJoCo, ViZDoom and the rest are 90 % of its size, over the
device tool's 64 MiB transfer), and writes `.gpu/site.tgz` (git-ignored).

    .venv/bin/python bench/gpu_carry.py                      # .gpu/site.tgz for the device's Python 3.12
    .venv/bin/python bench/gpu_carry.py --python-version 3.11 --out /tmp/carry   # to try it on this machine

With the venv's Python, where fleetd is installed: its closure is read from that environment's
metadata (a python3 without fleetd finds nothing to carry and says so).

On the device, the call carries `.gpu` and begins with bench/gpu_session.sh (which unpacks it).
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# What the device image already holds (/work/.library/device/KINDS.md, "Python packages already
# there"), so not carried: torch and its CUDA wheels above all.
ON_DEVICE = {
    "anyio", "certifi", "charset-normalizer", "click", "cloudpickle", "contourpy", "cycler", "filelock",
    "fonttools", "fsspec", "h11", "httpcore", "httpx", "idna", "jinja2", "kiwisolver", "markdown",
    "markdown-it-py", "markupsafe", "matplotlib", "mdurl", "mpmath", "networkx", "numpy", "nvidia-ml-py",
    "packaging", "pillow", "prometheus-client", "psutil", "pygments", "pyparsing", "python-dateutil",
    "pyyaml", "requests", "rich", "setuptools", "shellingham", "six", "sympy", "torch", "triton", "typer",
    "typing-extensions", "urllib3", "uvloop", "annotated-doc",
}
ENVPOOL_KEEP = {"atari", "classic_control", "toy_text", "python", "__init__.py", "entry.py", "registration.py"}
ASSETS_KEEP = {"atari", "__init__.py"}  # envpool_assets: the Atari ROMs; MuJoCo's, ViZDoom's, ... not
NOT_CARRIED_PREFIX = "envpool-assets-mujoco"  # MuJoCo's large assets, 450 MiB unpacked
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "any"]
BUDGET_MIB = 56.0  # the transfer's 64 MiB, less this checkout (about 5 MiB) and some room


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(root: str = "fleetd") -> dict[str, str]:
    """Every distribution `root` needs (extras and environment markers aside), at this venv's versions."""
    found: dict[str, str] = {}
    todo = [root]
    while todo:
        name = canonical(todo.pop())
        if name in found:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        found[name] = dist.version
        for requirement in dist.requires or []:
            if "extra ==" in requirement:
                continue
            todo.append(re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0])
    found.pop(canonical(root), None)
    return found


def to_carry(needed: dict[str, str]) -> list[str]:
    """`name==version` for what the device image lacks."""
    return [f"{name}=={version}" for name, version in sorted(needed.items())
            if name not in ON_DEVICE and not name.startswith(NOT_CARRIED_PREFIX)]


def install(pins: list[str], site: Path, python_version: str) -> None:
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--only-binary=:all:", "--no-compile",
               "--target", str(site), "--python-version", python_version, "--implementation", "cp", *platforms, *pins]
    subprocess.run(command, check=True)


def prune_envpool(site: Path) -> list[str]:
    """EnvPool's env families other than ENVPOOL_KEEP, gone; its `entry.py`, which registers
    every family's ids at `import envpool`, rewritten to register the kept ones alone (several
    registrations read their family's assets at import)."""
    root = site / "envpool"
    removed = []
    for child in sorted(root.iterdir()):
        if child.name not in ENVPOOL_KEEP and not child.name.endswith(".dist-info"):
            shutil.rmtree(child) if child.is_dir() else child.unlink()
            removed.append(child.name)
    entry = root / "entry.py"
    kept = [line for line in entry.read_text().splitlines()
            if not line.startswith("import envpool.") or line.split(".")[1] in ENVPOOL_KEEP]
    entry.write_text("\n".join(kept) + "\n")
    return removed


def prune_assets(site: Path) -> None:
    for child in (site / "envpool_assets").iterdir():
        if child.name not in ASSETS_KEEP:
            shutil.rmtree(child) if child.is_dir() else child.unlink()


def pack(site: Path, out: Path) -> float:
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:gz") as tar:
        for child in sorted(site.iterdir()):
            if child.name != "bin":
                tar.add(child, arcname=child.name)
    return out.stat().st_size / 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python-version", default="3.12", help="the device's python3 (KINDS.md: 3.12)")
    parser.add_argument("--out", type=Path, default=REPO / ".gpu" / "site.tgz")
    args = parser.parse_args()
    needed = closure()
    if not needed:
        print(f"bench/gpu_carry.py: {sys.executable} has no fleetd installed, so no closure to carry: run it "
              "with the venv's Python, `.venv/bin/python bench/gpu_carry.py`", file=sys.stderr)
        return 2
    pins = to_carry(needed)
    print(f"carrying {len(pins)} distributions: {' '.join(pins)}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        install(pins, site, args.python_version)
        print(f"envpool pruned of: {', '.join(prune_envpool(site))}")
        prune_assets(site)
        (site / "fleetd-carry-python").write_text(args.python_version + "\n")  # gpu_session.sh checks it
        size = pack(site, args.out)
    print(f"wrote {args.out}: {size:.1f} MiB (budget {BUDGET_MIB:.0f})")
    if size > BUDGET_MIB:
        print("too large for the device tool's 64 MiB transfer with this checkout: prune more", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
