"""The environment a worker process starts with: secrets removed, logging silenced.

Imported by the app side (``kernels.workers``) to build the child's environment and by
the worker itself (``kernels.harness.worker``) as a second line of defence when it is
started by hand. No JAX here.

A variable reaches a worker only when its name is on the allowlist (``ALLOWED_NAMES``,
``ALLOWED_PREFIXES``: what Python, JAX, XLA, libtpu and CUDA read, plus whatever the
user names in ``TILEWRIGHT_WORKER_ENV``) and neither its name (``KEY``, ``TOKEN``...)
nor its value (a URL with ``user:password@``, a known token shape) looks like a
credential. ``secret_values()`` collects what was withheld, so that ``redact`` can
remove those values from anything that comes back from a candidate.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

# A variable whose name contains one of these (any case) never reaches a worker.
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH",
                  "COOKIE", "PRIVATE", "SESSION", "PWD_")
SECRET_PREFIXES = ("ANTHROPIC_", "OPENAI_")

# What a worker may inherit (exact names, then prefixes). Everything else is withheld:
# an unknown variable is more likely a service's configuration than something JAX reads.
ALLOWED_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TZ", "TMPDIR",
    "PWD", "HOSTNAME", "LD_LIBRARY_PATH", "LD_PRELOAD", "VIRTUAL_ENV", "CONDA_PREFIX",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "OMP_NUM_THREADS",
    "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS", "NO_COLOR",
    "COLUMNS", "LINES",
})
ALLOWED_PREFIXES = ("LC_", "PYTHON", "JAX_", "XLA_", "TPU_", "LIBTPU", "PJRT_", "TF_",
                    "CUDA", "NVIDIA_", "NCCL_", "GLOG_", "GRPC_", "ABSL_", "CLOUD_TPU",
                    "MEGASCALE_", "XDG_", "TILEWRIGHT_", "KMP_", "MALLOC_", "CONDA_")
USER_ALLOWED = "TILEWRIGHT_WORKER_ENV"  # comma-separated extra names the user allows

# Values that are credentials whatever their variable is called.
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/\s:@]*):"
                              r"(?P<password>[^/\s@]+)@")
_TOKEN_SHAPES = re.compile(
    r"\b(?:sk-(?:ant-)?[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|glpat-[A-Za-z0-9_-]{16,}|xox[abposr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}"
    r"|AIza[0-9A-Za-z_-]{30,}|hf_[A-Za-z0-9]{30,}|ya29\.[0-9A-Za-z_-]{20,}"
    r"|eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,})")
_PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE "
                          r"KEY-----|$)", re.S)
MIN_SECRET_LEN = 6  # shorter values would redact ordinary words

# Set before JAX is imported: keeps XLA/TF/libtpu/gRPC chatter out of the captured
# stderr (it is captured anyway, this keeps it short). User values win.
QUIET = {
    "TF_CPP_MIN_LOG_LEVEL": "3",
    "TF_CPP_MAX_VLOG_LEVEL": "0",
    "GLOG_minloglevel": "3",
    "TPU_STDERR_LOG_LEVEL": "3",
    "TPU_MIN_LOG_LEVEL": "3",
    "GRPC_VERBOSITY": "ERROR",
    "ABSL_MIN_LOG_LEVEL": "3",
    "PYTHONUNBUFFERED": "1",  # candidate prints land in the capture before a reply
    "PYTHONDONTWRITEBYTECODE": "1",
}


def is_secret(name: str) -> bool:
    """The variable's name says it holds a credential."""
    upper = name.upper()
    return any(m in upper for m in SECRET_MARKERS) or upper.startswith(SECRET_PREFIXES)


def looks_like_credential(value: str) -> bool:
    """The value is a credential whatever its name: a URL with a password, a token."""
    return bool(_URL_CREDENTIALS.search(value) or _TOKEN_SHAPES.search(value)
                or "PRIVATE KEY-----" in value)


def is_allowed(name: str, extra: frozenset[str] = frozenset()) -> bool:
    return name in ALLOWED_NAMES or name in extra or name.startswith(ALLOWED_PREFIXES)


def _user_allowed(source: Mapping[str, str]) -> frozenset[str]:
    return frozenset(n.strip() for n in source.get(USER_ALLOWED, "").split(",") if n.strip())


def withheld(name: str, value: str, extra: frozenset[str] = frozenset()) -> bool:
    """True when the variable must not reach a worker."""
    return (not is_allowed(name, extra) or is_secret(name) or looks_like_credential(value))


def secret_values(base: Mapping[str, str] | None = None) -> list[str]:
    """Every value the app knows that must never come back from a candidate: the values
    of secret-named variables, credential-shaped values and the passwords inside URLs.
    Longest first, so a value is replaced before any of its parts."""
    source = os.environ if base is None else base
    found: set[str] = set()
    for name, value in source.items():
        if is_secret(name) or looks_like_credential(value):
            if len(value) >= MIN_SECRET_LEN:
                found.add(value)
            for match in _URL_CREDENTIALS.finditer(value):
                if len(match["password"]) >= MIN_SECRET_LEN:
                    found.add(match["password"])
            found.update(m.group(0) for m in _TOKEN_SHAPES.finditer(value))
    return sorted(found, key=len, reverse=True)


def redact(text: str, secrets: list[str] | tuple[str, ...] = ()) -> str:
    """``text`` with every known secret value, URL password, token-shaped string and
    private key replaced by ``[redacted]``."""
    for value in secrets:
        if value in text:
            text = text.replace(value, "[redacted]")
    text = _URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}:[redacted]@", text)
    text = _TOKEN_SHAPES.sub("[redacted]", text)
    return _PRIVATE_KEY.sub("[redacted private key]", text)


def worker_environment(base: Mapping[str, str] | None = None,
                       overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: ``base`` (default os.environ) minus secrets, plus quiet
    logging defaults, plus ``overrides`` (secret-named overrides are dropped too).

    JAX_PLATFORMS is passed through untouched: on a TPU host the worker must use the TPU.
    """
    source = dict(os.environ if base is None else base)
    extra = _user_allowed(source)
    env = {k: v for k, v in source.items() if not withheld(k, v, extra)}
    for key, value in QUIET.items():
        env.setdefault(key, value)
    for key, value in (overrides or {}).items():  # the app's own: allowlist not needed
        if not is_secret(key) and not looks_like_credential(value):
            env[key] = value
    # The worker runs ``python -m kernels.harness.worker``: make the package importable
    # even when tilewright is not installed (running from a checkout).
    root = str(Path(__file__).resolve().parent.parent)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        env["PYTHONPATH"] = os.pathsep.join([root, *paths])
    return env


def scrub_current_process() -> None:
    """Remove secrets from this process's own environment (worker side)."""
    for key in [k for k, v in os.environ.items() if is_secret(k) or looks_like_credential(v)]:
        del os.environ[key]
    for key, value in QUIET.items():
        os.environ.setdefault(key, value)
