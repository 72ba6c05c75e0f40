"""distlab's contract with the packages it builds on: the versions it is tested with, checked at import.

``pyproject.toml`` declares a range for each dependency, and those ranges are exactly what CI installs and runs:
the oldest versions they allow and the newest available (``make test-versions``, scripts/check_versions.py).
:func:`check_versions` reads the same ranges from distlab's installed metadata (so they cannot drift apart) and
refuses, in one line, an environment outside them: an untested Lightning fails at ``import distlab`` with the
version found and the range supported, not with an ImportError deep inside a Lightning module.
``DISTLAB_ALLOW_UNTESTED=1`` imports anyway (one warning line), e.g. for a GPU build of torch from a container.
"""

from __future__ import annotations

import os
import sys
import warnings
from importlib import metadata

ALLOW_ENV = "DISTLAB_ALLOW_UNTESTED"


class UntestedVersionError(ImportError):
    """A dependency's installed version lies outside the range distlab declares (and tests)."""


def declared_ranges() -> dict[str, str]:
    """{package: specifier} of distlab's runtime dependencies, from its installed metadata ({} if not installed)."""
    from packaging.requirements import Requirement

    try:
        requires = metadata.requires("distlab") or []
    except metadata.PackageNotFoundError:
        return {}
    out = {}
    for line in requires:
        req = Requirement(line)
        if req.marker is None:  # extras (dev, plots, ...) are not the runtime contract
            out[req.name] = str(req.specifier)
    return out


def outside_ranges(ranges: dict[str, str] | None = None) -> list[str]:
    """``name version (supported: spec)`` for every installed dependency outside its declared range."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    found = []
    for name, spec in (declared_ranges() if ranges is None else ranges).items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # pip would have refused to install distlab without it; an import error will say so
        try:
            ok = SpecifierSet(spec).contains(Version(installed), prereleases=True)  # NGC builds: 2.14.0a0+...
        except InvalidVersion:
            ok = True  # a version string packaging cannot read: nothing to say about it
        if not ok:
            found.append(f"{name} {installed} (supported: {name}{spec})")
    return found


def check_versions(ranges: dict[str, str] | None = None) -> None:
    """Refuse (or, with DISTLAB_ALLOW_UNTESTED=1, warn about) dependencies outside the tested ranges."""
    bad = outside_ranges(ranges)
    if not bad:
        return
    wanted = " ".join(f"'{b.split('supported: ')[1].rstrip(')')}'" for b in bad)
    line = (
        f"distlab is tested with other versions than this environment has: {'; '.join(bad)}; "
        f"pip install {wanted}, or set {ALLOW_ENV}=1 to try anyway"
    )
    if os.environ.get(ALLOW_ENV, "").strip() not in ("", "0"):
        warnings.warn(line, stacklevel=2)
        return
    _refuse(line, UntestedVersionError)


# Launch variables Lightning and torch read as integers, some on import (Lightning's rank_zero_only reads
# LOCAL_RANK/RANK when it is imported): a value that is no count fails there in a traceback.
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
                  "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID")  # fmt: skip


def check_rank_variables(env: dict[str, str] | None = None) -> None:
    """Each launch variable that is set holds a whole number (>= 1 for a size); one line otherwise, before Lightning
    is imported and reads them. (Whether they agree with the trainer is distlab.preflight's check.)"""
    env = os.environ if env is None else env
    for key in RANK_VARIABLES:
        value = env.get(key)
        if value is None or (value.strip().isdigit() and (int(value) >= 1 or "SIZE" not in key)):
            continue
        line = (
            f"{key} is set but empty ({key}=''; an unset shell variable?); set it to a value, or unset {key}"
            if not value.strip()
            else f"{key}={value!r} is not a {'process count (an integer >= 1)' if 'SIZE' in key else 'rank (an integer >= 0)'}; "
            f"unset {key} (a launcher such as torchrun sets it), or set it to a number"
        )
        from distlab.errors import ConfigError

        _refuse(line, ConfigError)


def check_working_folder() -> None:
    """The process's working folder must exist: one deleted under a shell (``rm -rf runs`` from another terminal
    while this one is in runs/) makes torch's import fail with an oneMKL "cannot load libtorch_cpu.so" that blames
    torch. One line instead, before anything is imported."""
    try:
        os.getcwd()
    except FileNotFoundError:
        line = (
            "the current folder no longer exists (deleted while this shell was in it?); cd to an existing folder and "
            "run the command again"
        )
        _refuse(line, OSError)


def _refuse(line: str, error: type[Exception]) -> None:
    """A check that runs before Lightning is imported, failing: under the distlab command one line on stderr and
    exit 2 (logging is not set up yet, so it is printed), else ``error(line)`` for a script that imports distlab."""
    if _running_the_cli():
        print(f"distlab: error: {line}", file=sys.stderr)
        raise SystemExit(2) from None
    raise error(line) from None


def _running_the_cli() -> bool:
    """Whether this import comes from the ``distlab`` console script or ``python -m distlab`` (also torchrun's)."""
    first = sys.argv[0] if sys.argv else ""
    return os.path.basename(first) == "distlab" or first == "-m"
