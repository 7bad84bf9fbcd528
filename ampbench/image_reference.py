"""Container image references, checked against the grammar registries and Kubernetes use
(github.com/distribution/reference): `[host[:port]/]path[:tag][@digest]`."""

from __future__ import annotations

import re

from ampbench.errors import AmpbenchError

_ALPHANUMERIC = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALPHANUMERIC}(?:{_SEPARATOR}{_ALPHANUMERIC})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
_NAME = rf"(?:{_HOST}(?::[0-9]+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
REFERENCE = re.compile(rf"(?P<name>{_NAME})(?::{_TAG})?(?:@{_DIGEST})?")
MAX_NAME_LENGTH = 255


def check_image_reference(reference: str) -> str:
    """The reference, or an error saying why a registry would not take it."""
    if not reference:
        raise AmpbenchError("--image: empty; give an image such as ghcr.io/org/ampbench:0.1.0")
    match = REFERENCE.fullmatch(reference)
    if match is None:
        raise AmpbenchError(
            f"--image '{reference}': not a valid image reference ([host[:port]/]path[:tag]"
            "[@digest], path in lower case letters, digits and . _ - separators)"
        )
    first, _, rest = match["name"].partition("/")
    is_host = rest and ("." in first or ":" in first or first == "localhost")
    if rest and not is_host and not re.fullmatch(_PATH_COMPONENT, first):
        # As Docker and containerd read it, "Org/x" is a path on Docker Hub, not a host:
        # it must be lower case.
        raise AmpbenchError(f"--image '{reference}': the repository path must be lower case")
    if len(match["name"]) > MAX_NAME_LENGTH:
        raise AmpbenchError(f"--image: the name is longer than {MAX_NAME_LENGTH} characters")
    return reference
