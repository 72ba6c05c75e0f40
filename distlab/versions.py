"""What ``import distlab`` checks before it imports torch or Lightning, each failure one line: the dependency
versions against the ranges ``pyproject.toml`` declares (read from distlab's installed metadata, so they cannot drift
apart; ``DISTLAB_ALLOW_UNTESTED=1`` imports anyway, with a warning), releases published as malware, the launch
variables, the working folder, and files that shadow a dependency. See docs/guide.md, "Install and versions".
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import traceback
import warnings
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from distlab.errors import ConfigError
from distlab.switches import DEBUG_ENV, switch_on

ALLOW_ENV = "DISTLAB_ALLOW_UNTESTED"

# Releases published as malware, refused whatever ALLOW_ENV says and before anything imports them: lightning and
# pytorch-lightning 2.6.2 and 2.6.3 ran a credential-stealing payload on import (2026-04-30, GHSA-w37p-236h-pfx3;
# pulled from PyPI within the hour, still in mirrors and caches). Found by their installed metadata: nothing is run.
COMPROMISED = {
    "lightning": ("2.6.2", "2.6.3"),
    "pytorch-lightning": ("2.6.2", "2.6.3"),
}


class UntestedVersionError(ImportError):
    """A dependency's installed version lies outside the range distlab declares (and tests)."""


class CompromisedReleaseError(ImportError):
    """An installed dependency is a release published as malware (:data:`COMPROMISED`)."""


def check_compromised(installed: dict[str, str] | None = None) -> None:
    """Refuse, in one line and without importing it, a dependency release that was published as malware. Not
    overridable: importing it is the attack. ``installed`` ({name: version}) replaces the environment's, for tests."""
    for name, bad in COMPROMISED.items():
        try:
            version = metadata.version(name) if installed is None else installed.get(name)
        except metadata.PackageNotFoundError:
            continue
        if version in bad:
            ran = name.replace("-", "_") in sys.modules
            line = (
                f"{name} {version} is a compromised release (GHSA-w37p-236h-pfx3: importing it runs a "
                f"credential-stealing payload); {'this process had already imported it' if ran else 'distlab did not import it'}: "
                f"pip install '{name}>=2.6.6,<2.7', and if it was ever imported on this machine, rotate the credentials "
                "the machine holds"
            )
            _refuse(line, CompromisedReleaseError)


def declared_ranges() -> dict[str, str]:
    """{package: specifier} of distlab's runtime dependencies, from its installed metadata ({} if not installed)."""
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
                  "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS", "MASTER_PORT")  # fmt: skip


def check_rank_variables() -> None:
    """Each launch variable that is set holds a whole number in its domain; one line otherwise, before Lightning
    is imported and reads them. (Whether they agree with the trainer is distlab.launch.check_launch_env's check.)"""
    for key in RANK_VARIABLES:
        value = os.environ.get(key)
        low, high, what = (
            (1, 65535, "TCP port (an integer 1..65535)")
            if key == "MASTER_PORT"
            else (1, 1 << 31, "process count (an integer >= 1)")
            if "SIZE" in key or key == "SLURM_NTASKS"
            else (0, 1 << 31, "rank (an integer >= 0)")
        )
        if value is None or (value.strip().isdigit() and low <= int(value) <= high):
            continue
        line = (
            f"{key} is set but empty ({key}=''; an unset shell variable?); set it to a value, or unset {key}"
            if not value.strip()
            else f"{key}={value!r} is not a {what}; unset {key} (a launcher such as torchrun sets it), or set it to a "
            "number"
        )
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


def check_shadowed_modules() -> None:
    """Each dependency must be imported from where it is installed: a file of the user's with its name (a
    ``lightning.py`` or ``torch/`` beside a script, on ``PYTHONPATH=.``) would be imported instead, run its code, and
    fail later as "'lightning' is not a package". Found by where Python would import it from; nothing is run."""
    searched = {Path(p or ".").resolve() for p in sys.path}
    for dist_name in declared_ranges():
        try:
            dist = metadata.distribution(dist_name)
        except metadata.PackageNotFoundError:
            continue
        site = Path(str(dist.locate_file(""))).resolve()
        names = (dist.read_text("top_level.txt") or dist_name.replace("-", "_").lower()).split()
        for name in names:
            try:
                spec = importlib.util.find_spec(name)
            except (ImportError, ValueError):
                continue
            if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
                continue
            origin = Path(spec.origin).resolve()
            top = origin.parent if origin.name == "__init__.py" else origin  # its package folder, or it
            if site in origin.parents or top.parent not in searched:
                continue  # the installed one (an editable install lies outside site-packages, not on sys.path)
            line = (
                f"'import {name}' would read {top}, not the installed {dist_name} {dist.version}: a file or folder "
                f"of yours has its name; rename it (and remove its __pycache__)"
            )
            _refuse(line, ImportError)


@contextlib.contextmanager
def import_failures_in_one_line() -> Iterator[None]:
    """Under the distlab command, a dependency that fails to import (a broken install: a missing shared library,
    a package built for another Python) is one line naming the package that failed and who imported it, exit 1;
    ``DISTLAB_DEBUG=1`` shows the traceback. A script that imports distlab gets the ImportError itself."""
    try:
        yield
    except Exception as e:  # an ImportError, or a value a dependency read from the environment
        if not _running_the_cli() or switch_on(DEBUG_ENV):
            raise
        chain = _packages_on_the_way(e)
        if isinstance(e, ImportError):
            failed = chain[-1] if chain else getattr(e, "name", None) or "a dependency"
            via = f" (on the way: {' -> '.join(chain)})" if len(chain) > 1 else ""
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            line = (
                f"importing {failed} failed{via}: {type(e).__name__}: {first}; its install is broken: reinstall it "
                f"(pip install --force-reinstall {failed}), or uninstall it if nothing needs it ({DEBUG_ENV}=1 shows the "
                "traceback)"
            )
            _refuse(line, ImportError, code=1)
        said = " ".join(ln.strip() for ln in str(e).splitlines() if ln.strip())[:300]
        line = f"importing {chain[-1] if chain else 'a dependency'} failed: {type(e).__name__}: {said}"
        _refuse(line, type(e), code=1)


def _packages_on_the_way(e: BaseException) -> list[str]:
    """The top-level packages an import error passed through, outermost first (distlab's own left out)."""
    own = Path(__file__).resolve().parent
    found: list[str] = []
    for frame in traceback.extract_tb(e.__traceback__):
        if frame.filename.startswith("<") or own in Path(frame.filename).resolve().parents:
            continue
        parts = Path(frame.filename).parts
        if "site-packages" in parts or "dist-packages" in parts:
            at = max(i for i, p in enumerate(parts) if p in ("site-packages", "dist-packages"))
            name = parts[at + 1].removesuffix(".py") if len(parts) > at + 1 else ""
        else:
            name = Path(frame.filename).parent.name if Path(frame.filename).name == "__init__.py" else ""
        if name and (not found or found[-1] != name):
            found.append(name)
    return found


def _refuse(line: str, error: type[Exception], code: int = 2) -> None:
    """A check that runs before Lightning is imported, failing: under the distlab command one line on stderr and
    exit ``code`` (2: refused, the default; logging is not set up yet, so it is printed), else ``error(line)`` for a
    script that imports distlab."""
    if _running_the_cli():
        print(f"distlab: error: {line}", file=sys.stderr)
        raise SystemExit(code) from None
    raise error(line) from None


def _running_the_cli() -> bool:
    """Whether this import comes from the ``distlab`` console script or ``python -m distlab`` (also torchrun's)."""
    first = sys.argv[0] if sys.argv else ""
    return os.path.basename(first) == "distlab" or first == "-m"
