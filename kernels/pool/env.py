"""The environment a worker process starts with: secrets removed, logging silenced.

Imported by the app side (``kernels.pool.workers``) to build the child's environment and by
the worker itself (``kernels.worker.main``) as a second line of defence when it is
started by hand. No JAX here.

A variable reaches a worker only when its name is on the allowlist (``ALLOWED_NAMES``,
``ALLOWED_PREFIXES``: what Python, JAX, XLA, libtpu and CUDA read, plus whatever the
user names in ``TILEWRIGHT_WORKER_ENV``) and neither its name (``KEY``, ``TOKEN``...)
nor its value (a URL with ``user:password@``, a known token shape) looks like a
credential. ``secret_values()`` collects what was withheld, so that ``redact`` can
remove those values from anything that comes back from a candidate.

Also what this host offers the workers, found without JAX: its usable cores and TPU
chips, and the environment that pins a worker to one chip.
"""

from __future__ import annotations

import glob
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

# What the app tells the judge through its environment (``kernels.pool.workers`` sets them):
# the judge's on-disk cache of TPU compiles (``kernels.worker.tpu.compile_pool``; never the
# candidate process's: ``kernels.worker.candidate.judge`` removes it from its environment) and
# the user's ``tilewright calibrate`` pairs (``kernels.worker.tpu.fidelity``).
ESTIMATE_CACHE = "TILEWRIGHT_ESTIMATE_CACHE"
CALIBRATION = "TILEWRIGHT_CALIBRATION"


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


def secret_values(base: Mapping[str, str] | None = None,
                  home: str | None = None) -> list[str]:
    """Every value the app knows that must never come back from a candidate: the values
    of secret-named variables, credential-shaped values, the passwords inside URLs and
    the secrets in the user's well-known credential files (``credential_file_values``),
    each also as it reads hex-, base64- or rot13-encoded (``encoded_forms``). Longest
    first, so a value is replaced before any of its parts."""
    source = os.environ if base is None else base
    found: set[str] = set()
    for name, value in source.items():
        if is_secret(name) or looks_like_credential(value):
            if len(value) >= MIN_SECRET_LEN:
                found.add(value)
            found.update(_embedded_secrets(value))
    if home is None and base is None:
        home = os.environ.get("HOME")
    if home:
        found.update(credential_file_values(home))
    for value in list(found):
        found.update(encoded_forms(value))
    return sorted(found, key=len, reverse=True)


# Files under $HOME that hold credentials, and how their secrets are found. Workers
# cannot read them (Landlock); if one does anyway (confinement unavailable), what it
# prints is redacted by value. Read app-side, each at most CREDENTIAL_FILE_LIMIT bytes.
CREDENTIAL_FILES = (
    ".netrc", "_netrc", ".git-credentials", ".pypirc", ".npmrc", ".aws/credentials",
    ".aws/config", ".docker/config.json", ".config/gh/hosts.yml", ".kube/config",
    ".config/gcloud/application_default_credentials.json",
    ".config/gcloud/credentials.db",
)
CREDENTIAL_GLOBS = (".ssh/*", ".config/gcloud/legacy_credentials/*/*.json")
CREDENTIAL_FILE_LIMIT = 1 << 20
# "password VALUE" (netrc), "key = VALUE" / "key: VALUE" / "key": "VALUE" for names that
# say secret, token, password, key or auth.
_NETRC_PASSWORD = re.compile(r"\b(?:password|account)\s+(\S+)")
_KEYED_SECRET = re.compile(
    r"""["']?[\w.-]*(?:secret|token|password|passwd|private_key|key_id|access_key|auth|"""
    r"""_key|-key|-data)[\w.-]*["']?\s*[:=]\s*["']?([^\s"',]+)""", re.IGNORECASE)
_PEM_BODY = re.compile(r"-----BEGIN [A-Z0-9 ]+-----(.*?)-----END [A-Z0-9 ]+-----", re.S)


def credential_file_values(home: str) -> list[str]:
    """Secrets found in the well-known credential files under ``home``: netrc and
    config passwords, tokens and keys, and the body of every PEM block (an ssh key
    printed without its BEGIN/END lines is still redacted, line by line)."""
    import glob

    paths = [os.path.join(home, name) for name in CREDENTIAL_FILES]
    for pattern in CREDENTIAL_GLOBS:
        paths += sorted(glob.glob(os.path.join(home, pattern)))[:64]
    found: set[str] = set()
    for path in paths:
        try:
            if not os.path.isfile(path) or os.path.getsize(path) > CREDENTIAL_FILE_LIMIT:
                continue
            with open(path, "rb") as fh:
                text = fh.read(CREDENTIAL_FILE_LIMIT).decode("utf-8", "replace")
        except OSError:
            continue
        if path.endswith(".pub"):
            continue  # public keys are meant to be shown
        for block in _PEM_BODY.findall(text) + ([text] if "PRIVATE KEY" in text else []):
            body = "".join(ln.strip() for ln in block.splitlines()
                           if ln.strip() and ":" not in ln and "-----" not in ln)
            if len(body) >= 16:
                found.add(body)
            found.update(ln.strip() for ln in block.splitlines()
                         if len(ln.strip()) >= 16 and "-----" not in ln)
        text = _PEM_BODY.sub(" ", text)
        for match in (*_NETRC_PASSWORD.finditer(text), *_KEYED_SECRET.finditer(text)):
            value = match.group(1).strip().strip("\"'")
            if len(value) >= MIN_SECRET_LEN:
                found.add(value)
        found.update(_embedded_secrets(text))
    return sorted(found)


def _embedded_secrets(text: str) -> set[str]:
    """The passwords inside URLs in ``text`` and its credential-shaped tokens."""
    found = {m["password"] for m in _URL_CREDENTIALS.finditer(text)
             if len(m["password"]) >= MIN_SECRET_LEN}
    return found | {m.group(0) for m in _TOKEN_SHAPES.finditer(text)}


MIN_ENCODED_LEN = 8  # an encoded fragment shorter than this would redact ordinary text
_ROT13 = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
                       "NOPQRSTUVWXYZABCDEFGHIJKLMnopqrstuvwxyzabcdefghijklm")


def encoded_forms(value: str) -> list[str]:
    """``value`` as a candidate might smuggle it: hex (both cases), base64 and urlsafe
    base64 wherever it starts in the encoded text (the characters that depend on
    ``value`` alone, for each of the three byte alignments), rot13 and reversed."""
    import base64

    raw = value.encode()
    forms = {raw.hex(), raw.hex().upper(), value.translate(_ROT13), value[::-1]}
    for shift, start in ((0, 0), (1, 2), (2, 3)):
        padded = b"\0" * shift + raw + b"\0\0\0"
        end = (shift + len(raw)) * 8 // 6
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            forms.add(encode(padded).decode()[start:end])
    forms.discard(value)
    return [f for f in forms if len(f) >= MIN_ENCODED_LEN]


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
    # The worker runs ``python -m tilewright.kernels.worker.main`` with the app's own
    # interpreter, which has tilewright installed (a checkout: ``pip install -e``).
    # Relative entries (and empty ones, which mean the current directory) are dropped:
    # a worker's imports never depend on where the app was started.
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.isabs(p)]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    else:
        env.pop("PYTHONPATH", None)
    # Python processes below a worker (a candidate's subprocess) do not put their
    # working or script directory on sys.path either (python -P for the workers).
    env["PYTHONSAFEPATH"] = "1"
    return env


def scrub_current_process() -> None:
    """Remove secrets from this process's own environment (worker side)."""
    for key in [k for k, v in os.environ.items() if is_secret(k) or looks_like_credential(v)]:
        del os.environ[key]
    for key, value in QUIET.items():
        os.environ.setdefault(key, value)


# -- this host: cores and TPU chips (found without JAX) ----------------------------------


def usable_cores() -> int:
    """CPU cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def local_tpu_chips() -> int:
    """TPU chips on this host, found without JAX: /dev/accel* (v4, v5e) or /dev/vfio/N."""
    visible = os.environ.get("TPU_VISIBLE_CHIPS")
    if visible:
        return len([c for c in visible.split(",") if c.strip()])
    accel = glob.glob("/dev/accel[0-9]*")
    if accel:
        return len(accel)
    return len([p for p in glob.glob("/dev/vfio/*") if Path(p).name.isdigit()])


def chip_env(chip: int, port: int) -> dict[str, str]:
    """Environment that pins one worker process to one TPU chip of the host."""
    return {
        "TPU_VISIBLE_CHIPS": str(chip),
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_PORT": str(port),
        "TPU_PROCESS_ADDRESSES": f"localhost:{port}",
        "CLOUD_TPU_TASK_ID": "0",
    }
