"""`make gpu-bundle`: everything a bare GPU machine with no network needs to run
benchmarks/gpu_check.sh, as wheels in one folder.

The machine already has Python with torch, torchvision and the scientific stack (PRESENT); the
bundle brings ampbench's own wheel and every other wheel its requirements (with the fp8 extra)
pull in for the target Python and platform, found by pip's resolver, not listed by hand:

1. `pip wheel --no-deps .`: the project's wheel; its Requires-Dist are the roots.
2. The roots less PRESENT and LEAVE_OUT (boto3, 17 MiB with botocore: s3:// only), with
   `mlflow` swapped for `mlflow-skinny` of the same release plus the two of full mlflow's
   requirements that a sqlite tracking store needs (SQLAlchemy and alembic, at full mlflow's
   own bounds): full mlflow adds its web UI and server stack (scikit-learn, Flask, gunicorn,
   graphene, docker, ...), over 40 MiB that `ampbench run` never imports.
3. One resolution of roots and PRESENT together (`pip install --dry-run --report`, wheels only,
   for the target), so that every version chosen also suits the packages already there; the
   bundle is what the roots reach in it, less PRESENT.
4. `pip download --no-deps` of exactly those versions.

The folder gets bundle.json (target, roots, wheels, size) and must stay under --max-mib: the
bundle travels with the data set. gpu_check.sh --bundle installs it with
`pip install --no-index --no-deps --target`.

    python scripts/gpu-bundle.py [--python-version 3.12] [--out dist/gpu-bundle]
"""

from __future__ import annotations

import argparse
import email.parser
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

REPO = Path(__file__).resolve().parent.parent
# What the GPU machines this project is lent already have (and so must not be shadowed).
PRESENT = (
    "torch torchvision numpy pyarrow pillow scipy matplotlib pandas psutil nvidia-ml-py "
    "pytest hypothesis"
)
EXTRAS = {"fp8"}
# Requirements left out by default, with why: what a machine with no network cannot use.
LEAVE_OUT = {"boto3": "used for s3:// locations only, which a machine with no network cannot reach"}
SKINNY = {"mlflow": "mlflow-skinny"}
# Of full mlflow's requirements, those the sqlite tracking store imports.
SQLITE_STORE = {"sqlalchemy", "alembic"}
MANIFEST = "bundle.json"
MiB = 1024 * 1024


class BundleError(Exception):
    """One line for the user: what failed and with which input."""


def pip(*args: str) -> None:
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
        raise BundleError(f"pip {args[0]} failed: {' '.join(lines[-2:]) or done.stderr[-500:]}")


def platforms(platform: str) -> tuple[list[str], str]:
    """`manylinux_2_28_x86_64` and every older manylinux tag a glibc 2.28 runs (pip matches
    --platform literally, and most wheels are tagged manylinux2014: glibc 2.17), and the arch."""
    prefix, _, rest = platform.partition("_2_")
    minor, _, arch = rest.partition("_")
    if prefix != "manylinux" or not minor.isdigit() or int(minor) < 17 or not arch:
        raise BundleError(f"--platform {platform}: expected manylinux_2_N_ARCH, N >= 17")
    tags = [f"manylinux_2_{n}_{arch}" for n in range(int(minor), 16, -1)]
    return [*tags, f"manylinux2014_{arch}"], arch


def target_environment(python_version: str, arch: str) -> dict[str, str]:
    """The marker environment of the target interpreter (CPython on Linux)."""
    return {
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "platform_machine": arch,
    }


def applies(requirement: Requirement, environment: dict[str, str], extras: set[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(
        requirement.marker.evaluate({**environment, "extra": extra}) for extra in extras | {""}
    )


def wheel_requirements(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(archive.read(name).decode())
    return [Requirement(line) for line in metadata.get_all("Requires-Dist") or []]


def resolve(requirements: list[str], target: list[str], *, deps: bool = True) -> dict[str, Any]:
    """pip's resolution of `requirements` (for the target, given its options; else for this
    interpreter), as {canonical name: report item}."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        pip(
            "install", "--dry-run", "--quiet", "--ignore-installed", "--report", str(report),
            "--target", str(Path(tmp) / "target"), *target, *([] if deps else ["--no-deps"]),
            *requirements,
        )  # fmt: skip
        items = json.loads(report.read_text())["install"]
    return {canonicalize_name(item["metadata"]["name"]): item for item in items}


def build_sdist_only(roots: list[str], out: Path) -> list[str]:
    """Wheels, built here, of the packages the roots need that PyPI has only as sdists
    (kfp-server-api): a resolution for the target takes wheels only, and finds these in `out`.
    Only pure-Python ones suit another interpreter."""
    built = []
    for item in resolve(roots, []).values():
        if item["download_info"]["url"].endswith(".whl"):
            continue
        pin = f"{item['metadata']['name']}=={item['metadata']['version']}"
        before = set(out.glob("*.whl"))
        pip("wheel", "--quiet", "--no-deps", "-w", str(out), pin)
        for wheel in set(out.glob("*.whl")) - before:
            _, _, _, tags = parse_wheel_filename(wheel.name)
            if any(tag.platform != "any" or tag.abi != "none" for tag in tags):
                raise BundleError(f"{pin}: PyPI has no wheel of it, and it is not pure Python")
        built.append(pin)
    return built


def closure(
    roots: list[Requirement], resolved: dict[str, Any], environment: dict[str, str]
) -> set[str]:
    """The names the roots reach in a resolution, following each package's requirements
    (markers evaluated for the target, extras as requested)."""
    reached: dict[str, set[str]] = {}
    pending = [(canonicalize_name(r.name), set(r.extras)) for r in roots]
    while pending:
        name, extras = pending.pop()
        if name in reached and extras <= reached[name]:
            continue
        reached[name] = reached.get(name, set()) | extras
        for line in resolved[name]["metadata"].get("requires_dist", []):
            requirement = Requirement(line)
            if applies(requirement, environment, reached[name]):
                pending.append((canonicalize_name(requirement.name), set(requirement.extras)))
    return set(reached)


def swap_mlflow(requirement: Requirement, target: list[str]) -> list[str]:
    """mlflow's requirement as mlflow-skinny of the release pip would pick, plus the sqlite
    store's packages at the bounds that release of full mlflow sets."""
    full = resolve([str(requirement)], target, deps=False)[canonicalize_name(requirement.name)]
    version = full["metadata"]["version"]
    store = [
        line
        for line in full["metadata"].get("requires_dist", [])
        if canonicalize_name(Requirement(line).name) in SQLITE_STORE
    ]
    return [f"{SKINNY[canonicalize_name(requirement.name)]}=={version}", *store]


def prepare_out(out: Path) -> None:
    """A fresh folder: an earlier bundle there is replaced, anything else is refused."""
    if out.exists():
        if not out.is_dir() or (any(out.iterdir()) and not (out / MANIFEST).is_file()):
            raise BundleError(f"--out {out}: exists and is not a bundle; name another folder")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    # Marked as a bundle from the start, so that a failed build can be made again in place.
    (out / MANIFEST).write_text(json.dumps({"complete": False}) + "\n")


def build(args: argparse.Namespace) -> dict[str, Any]:
    tags, arch = platforms(args.platform)
    target = ["--only-binary=:all:", "--python-version", args.python_version]
    for tag in tags:
        target += ["--platform", tag]
    environment = target_environment(args.python_version, arch)
    try:
        present = [Requirement(name) for name in args.present.split()]
    except InvalidRequirement as error:
        raise BundleError(f"--present: {error}") from None
    present_names = {canonicalize_name(r.name) for r in present}
    left_out = {canonicalize_name(name) for name in args.leave_out.split()}

    prepare_out(args.out)
    pip("wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(args.out), str(REPO))
    (own,) = args.out.glob("*.whl")
    roots: list[str] = []
    for requirement in wheel_requirements(own):
        name = canonicalize_name(requirement.name)
        if name in present_names | left_out or not applies(requirement, environment, EXTRAS):
            continue
        requirement.marker = None  # evaluated: it would name the extra pip is not asked for
        roots += swap_mlflow(requirement, target) if name in SKINNY else [str(requirement)]
    print(f"gpu-bundle: requirements beyond the machine's own: {', '.join(roots)}", flush=True)

    built = build_sdist_only(roots, args.out)
    if built:
        print(f"gpu-bundle: built from sdists (pure Python): {', '.join(built)}", flush=True)
    target += ["--find-links", str(args.out)]
    resolved = resolve([*roots, *map(str, present)], target)
    wanted = sorted(closure([Requirement(r) for r in roots], resolved, environment) - present_names)
    pins = [f"{resolved[name]['metadata']['name']}=={resolved[name]['metadata']['version']}"
            for name in wanted]  # fmt: skip
    pip("download", "--quiet", "--no-deps", "-d", str(args.out), *target, *pins)
    wheels = sorted(path.name for path in args.out.glob("*.whl"))
    size = sum(path.stat().st_size for path in args.out.iterdir())
    manifest = {
        "complete": True,
        "python_version": args.python_version,
        "platforms": tags,
        "present": args.present.split(),
        "roots": roots,
        "left_out": sorted(left_out),
        "wheels": wheels,
        "size_bytes": size,
    }
    (args.out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python-version", default="3.12", help="the target's (default 3.12)")
    parser.add_argument(
        "--platform",
        default="manylinux_2_28_x86_64",
        help="the newest manylinux tag the target runs (default manylinux_2_28_x86_64)",
    )
    parser.add_argument(
        "--present", default=PRESENT, help=f"requirements the target already meets ({PRESENT})"
    )
    parser.add_argument(
        "--leave-out",
        default=" ".join(LEAVE_OUT),
        help="requirements not bundled: "
        + "; ".join(f"{name}: {why}" for name, why in LEAVE_OUT.items()),
    )
    parser.add_argument("--out", type=Path, default=REPO / "dist" / "gpu-bundle")
    parser.add_argument("--max-mib", type=float, default=40.0, help="size limit (default 40)")
    args = parser.parse_args()
    try:
        Version(args.python_version)
    except InvalidVersion:
        parser.error(f"--python-version {args.python_version}: not a version")
    try:
        manifest = build(args)
    except BundleError as error:
        sys.exit(f"gpu-bundle: error: {error}")
    size = manifest["size_bytes"] / MiB
    print(
        f"gpu-bundle: {len(manifest['wheels'])} wheels for Python {args.python_version} "
        f"({manifest['platforms'][0]}), {size:.1f} MiB in {args.out} (limit {args.max_mib:g} MiB)"
    )
    if size > args.max_mib:
        sys.exit(f"gpu-bundle: error: {args.out}: {size:.1f} MiB, over {args.max_mib:g} MiB")


if __name__ == "__main__":
    main()
