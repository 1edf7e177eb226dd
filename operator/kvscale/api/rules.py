"""What the LLMEndpoint API refuses, written once for the API server (CEL) and for pydantic.

Each check is one regular expression in the syntax RE2 (CEL's `matches`) and Python's `re`
share, used by a CEL rule in the CRD and by a Python function the models call, so admission and
the operator's own parsing refuse the same values with the same message.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

JSON = dict[str, Any]

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


def matches(pattern: str) -> str:
    """CEL `matches(r'...')`: a raw string, so the pattern reads as in Python."""
    assert "'" not in pattern
    return f"matches(r'{pattern}')"


def matches_rule(pattern: str, message: str, negate: bool = False) -> JSON:
    """A CEL rule `self.matches(pattern)` (or its negation) with its message."""
    rule = f"self.{matches(pattern)}"
    return {"rule": f"!{rule}" if negate else rule, "message": message}


# --- endpoint names -----------------------------------------------------------------------

CHILD_SUFFIXES = ("-engine", "-router", "-routing")  # Services, a Deployment, a ConfigMap
# Only Service names (DNS labels, <name> and <name>-engine) and label values (<name>) are limited
# to 63 characters; the other children's names are DNS subdomains (253)
SERVICE_SUFFIXES = ("", "-engine")
NAME_LIMIT = 63
MAX_ENDPOINT_NAME = NAME_LIMIT - max(len(s) for s in SERVICE_SUFFIXES)
NAME_NOT_LABEL = (
    "metadata.name must be a DNS label (lowercase letters, digits and '-', no dots): the "
    "operator names the endpoint's Services <name>-engine and <name>-router, and Service "
    "names cannot contain dots"
)
NAME_TOO_LONG = (
    f"metadata.name must be at most {MAX_ENDPOINT_NAME} characters: the operator names the "
    f"endpoint's Services <name> and <name>-engine, and Service names are limited to "
    f"{NAME_LIMIT} characters"
)


def endpoint_name_problem(name: str) -> str | None:
    """Why `name` cannot name an LLMEndpoint, or None."""
    if not re.fullmatch(DNS_LABEL, name):
        return NAME_NOT_LABEL
    if len(name) > MAX_ENDPOINT_NAME:
        return NAME_TOO_LONG
    return None


ENDPOINT_RULES: list[JSON] = [
    {"rule": f"self.metadata.name.{matches(DNS_LABEL)}", "message": NAME_NOT_LABEL},
    {"rule": f"self.metadata.name.size() <= {MAX_ENDPOINT_NAME}", "message": NAME_TOO_LONG},
]

# --- paths --------------------------------------------------------------------------------

DOT_DOT = r"(^|/)\.\.(/|$)"
DOT_DOT_MESSAGE = "must not contain '..' path segments"


def no_dot_dot(path: str) -> str:
    if re.search(DOT_DOT, path):
        raise ValueError(DOT_DOT_MESSAGE)
    return path


NO_DOT_DOT_RULE = {"rule": f"!self.{matches(DOT_DOT)}", "message": DOT_DOT_MESSAGE}

# --- images -------------------------------------------------------------------------------

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST_LABEL = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = (
    rf"(?:{_HOST_LABEL}(?:\.{_HOST_LABEL})+(?::[0-9]+)?"
    rf"|localhost(?::[0-9]+)?|{_HOST_LABEL}:[0-9]+)"
)
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE = rf"^(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::{_TAG})?(?:@{_DIGEST})?$"
IMAGE_MESSAGE = (
    "must be an image reference such as registry.example.com:5000/team/engine:0.1.0 or "
    "kvscale/engine@sha256:<hex>: no scheme, a lowercase repository, an optional registry "
    "(with port), tag and digest"
)


def image_reference(image: str) -> str:
    if not re.fullmatch(IMAGE, image):
        raise ValueError(IMAGE_MESSAGE)
    return image


# --- engine arguments ---------------------------------------------------------------------

MANAGED_FLAGS = (
    "--model",
    "--served-model-name",
    "--host",
    "--port",
    "--max-model-len",
    "--block-size",
    "--memory-fraction",
    "--gpu-memory-utilization",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
    "--drain-timeout",
    "--admin-port",
    "--shutdown-grace",
    "--traffic-classes",
    "--tensor-parallel-size",
    "-tp",
    "--load-format",
)


def _flag_pattern(flag: str) -> str:
    dashes = len(flag) - len(flag.lstrip("-"))
    return "-" * dashes + flag[dashes:].replace("-", "[-_]")  # vLLM reads --max_model_len too


MANAGED_FLAG = rf"^(?:{'|'.join(_flag_pattern(f) for f in MANAGED_FLAGS)})(?:=.*)?$"
MANAGED_FLAG_MESSAGE = (
    "must not set a flag the operator manages (" + ", ".join(MANAGED_FLAGS) + "): "
    "use the matching spec field"
)
ARGUMENT = r"^(?:--?[A-Za-z0-9][A-Za-z0-9._-]*(?:=.*)?|-[0-9][0-9.eE+-]*|[^-].*)$"
ARGUMENT_MESSAGE = (
    "must be a flag (-x, --name or --name=value) or a value (not starting with '-', unless a "
    "negative number), on one line"
)


def engine_argument(arg: str) -> str:
    if not re.fullmatch(ARGUMENT, arg):
        raise ValueError(ARGUMENT_MESSAGE)
    if re.fullmatch(MANAGED_FLAG, arg):
        raise ValueError(MANAGED_FLAG_MESSAGE)
    return arg


# --- quantities ---------------------------------------------------------------------------

QUANTITY = r"^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?$"
QUANTITY_MESSAGE = "must be a Kubernetes quantity such as 500m, 2, 512Mi or 8Gi"
# negative or zero (CEL asks the quantity library: an int-or-string has no maxLength, so a regex
# over it would cost too much at admission)
NOT_POSITIVE = r"^(?:-.*|[+]?0*\.?0*(?:[eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?)$"
POSITIVE_MESSAGE = "must be greater than zero"


def quantity(value: int | str) -> int | str:
    if not re.fullmatch(QUANTITY, str(value)):
        raise ValueError(QUANTITY_MESSAGE)
    return value


def positive_quantity(value: int | str) -> int | str:
    text = str(value)
    if not re.fullmatch(QUANTITY, text):
        raise ValueError(QUANTITY_MESSAGE)
    if re.fullmatch(NOT_POSITIVE, text):
        raise ValueError(POSITIVE_MESSAGE)
    return value


SUFFIXES: dict[str, float] = {
    **{s: 1024**i for i, s in enumerate(("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{s: 1000**i for i, s in enumerate(("", "k", "M", "G", "T", "P", "E")) if s},
    "n": 1e-9, "u": 1e-6, "m": 1e-3,
}  # fmt: skip


def quantity_value(value: int | str) -> float:
    """A valid Kubernetes quantity's value (`8Gi` -> 8589934592.0, `500m` -> 0.5)."""
    text = str(value)
    number = re.match(r"^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", text)
    assert number is not None, text
    return float(number.group()) * SUFFIXES[text[number.end() :]]


QUANTITY_RULES: list[JSON] = [
    {"rule": "isQuantity(string(self))", "message": QUANTITY_MESSAGE},
    {
        "rule": "!isQuantity(string(self)) || sign(quantity(string(self))) == 1",
        "message": POSITIVE_MESSAGE,
    },
]

# --- Prometheus URL -----------------------------------------------------------------------

WHITESPACE = r"\s"
HTTP_URL_MESSAGE = (
    "must be an http:// or https:// URL with a host and no spaces, such as "
    "http://prometheus.monitoring:9090"
)
# 169.254.0.0/16 and fe80::/10, IPv4-mapped forms, and the integer, hex and octal spellings of
# an IPv4 address that resolvers accept (a hostname cannot be all digits)
_LINK_LOCAL = (
    r"169\.254\.[0-9.]*|fe[89ab][0-9a-f]?:.*"
    r"|(?:0{0,4}:){0,5}:?ffff:(?:169\.254\.[0-9.]*|a9fe:.*)"
    r"|[0-9]+|(?:[0-9.]*\.)?(?:0x[0-9a-f]*|0[0-9]+)(?:\.[0-9a-fx.]*)?"
)
LINK_LOCAL_HOST = rf"(?i)^(?:{_LINK_LOCAL})$"
# the same hosts inside a whole URL: CEL matches the bounded string itself (a regex over
# url(self).getHostname(), whose length the cost estimator cannot bound, costs too much)
LINK_LOCAL_URL = (
    rf"(?i)^[a-z][a-z0-9+.-]*://(?:[^/?#@]*@)?\[?(?:{_LINK_LOCAL})\]?(?::[0-9]*)?(?:[/?#].*)?$"
)
LINK_LOCAL_MESSAGE = (
    "must not point at a link-local address (169.254.0.0/16 or fe80::/10, in any spelling): "
    "those reach node and cloud metadata services"
)


def prometheus_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or re.search(WHITESPACE, url):
        raise ValueError(HTTP_URL_MESSAGE)
    if re.fullmatch(LINK_LOCAL_HOST, parts.hostname) or re.fullmatch(LINK_LOCAL_URL, url):
        raise ValueError(LINK_LOCAL_MESSAGE)
    return url


PROMETHEUS_URL_RULES: list[JSON] = [
    {
        "rule": "isURL(self) && url(self).getScheme() in ['http', 'https'] "
        f"&& url(self).getHostname() != '' && !self.{matches(WHITESPACE)}",
        "message": HTTP_URL_MESSAGE,
    },
    {
        "rule": f"!self.{matches(LINK_LOCAL_URL)}",
        "message": LINK_LOCAL_MESSAGE,
    },
]
