"""s3:// and local paths, one small module for datasets, checkpoints and exports.

The client comes from boto3's standard environment: the endpoint from AWS_ENDPOINT_URL_S3 or
AWS_ENDPOINT_URL, credentials from the standard chain. Error messages name the URI and the
service's error code, never a credential.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlparse

from ampbench.errors import AmpbenchError
from ampbench.logs import Progress, log

MULTIPART_CHUNK = 8 * 1024 * 1024


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def split_s3(uri: str) -> tuple[str, str]:
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise AmpbenchError(f"{uri}: not an s3://bucket/key URI")
    return parsed.netloc, parsed.path.lstrip("/")


def join(base: str, *parts: str) -> str:
    """Join path parts onto a local path or an s3:// URI."""
    if is_s3(base):
        return "/".join([base.rstrip("/"), *(part.strip("/") for part in parts)])
    return str(Path(base, *parts))


@cache
def client() -> Any:
    import boto3
    from botocore.config import Config

    config = Config(
        # S3-compatible stores (Ceph RGW, MinIO) are addressed by path, not virtual host.
        s3={"addressing_style": "path"},
        retries={"mode": "standard", "max_attempts": 5},
        connect_timeout=10,
        read_timeout=60,
        # Newer boto3 adds CRC checksums to every upload; older S3-compatible stores reject
        # them. Uploads are verified by size and ETag below instead.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    return boto3.session.Session().client("s3", config=config)


def _transfer_config() -> Any:
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(multipart_threshold=MULTIPART_CHUNK, multipart_chunksize=MULTIPART_CHUNK)


def describe_error(uri: str, error: Exception) -> AmpbenchError:
    """One line for a failed S3 call: the URI and what the service said, no credentials."""
    from boto3.exceptions import RetriesExceededError, S3UploadFailedError
    from botocore.exceptions import (
        ClientError,
        EndpointConnectionError,
        NoCredentialsError,
        ParamValidationError,
    )

    # boto3's transfers (upload_file, download_file) wrap what the service said.
    if isinstance(error, S3UploadFailedError) and isinstance(error.__context__, Exception):
        return describe_error(uri, error.__context__)
    if isinstance(error, RetriesExceededError) and isinstance(error.last_exception, Exception):
        return describe_error(uri, error.last_exception)
    if isinstance(error, ClientError):
        code = error.response.get("Error", {}).get("Code", "Unknown")
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        reasons = {
            "NoSuchBucket": "the bucket does not exist",
            "NoSuchKey": "no such object",
            "404": "no such object",
            "NotFound": "no such object",
            "AccessDenied": "access denied",
            "403": "access denied",
            "InvalidAccessKeyId": "the access key is not known to the server",
            "SignatureDoesNotMatch": "the secret key does not match the access key",
        }
        return AmpbenchError(f"{uri}: {reasons.get(code, code)} (S3 error {code}, HTTP {status})")
    if isinstance(error, EndpointConnectionError):
        return AmpbenchError(
            f"{uri}: cannot reach the S3 endpoint ({error.kwargs['endpoint_url']})"
        )
    if isinstance(error, NoCredentialsError):
        return AmpbenchError(f"{uri}: no S3 credentials found (set AWS_ACCESS_KEY_ID and friends)")
    if isinstance(error, ParamValidationError):
        return AmpbenchError(f"{uri}: invalid S3 request ({error})")
    return AmpbenchError(f"{uri}: S3 request failed ({type(error).__name__})")


def _s3_call(uri: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    from boto3.exceptions import Boto3Error
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return fn(*args, **kwargs)
    except (ClientError, BotoCoreError, Boto3Error) as error:
        raise describe_error(uri, error) from None


def head(uri: str) -> dict[str, Any]:
    bucket, key = split_s3(uri)
    return _s3_call(uri, client().head_object, Bucket=bucket, Key=key)


def list_keys(uri: str) -> list[tuple[str, int, str]]:
    """(key, size, ETag) of every object under an s3://bucket/prefix/."""
    bucket, prefix = split_s3(uri)
    paginator = client().get_paginator("list_objects_v2")
    found = []
    pages = _s3_call(uri, lambda: list(paginator.paginate(Bucket=bucket, Prefix=prefix)))
    for page in pages:
        for item in page.get("Contents", []):
            found.append((item["Key"], item["Size"], item["ETag"].strip('"')))
    return found


def _cache_root(cache_dir: Path) -> Path:
    return cache_dir / "s3"


def _cached_object(uri: str, etag: str, cache_dir: Path) -> Path:
    bucket, key = split_s3(uri)
    digest = hashlib.sha256(f"{bucket}\0{key}\0{etag}".encode()).hexdigest()[:32]
    return _cache_root(cache_dir) / digest / Path(key).name


def fetch(uri: str, cache_dir: Path) -> tuple[Path, bool]:
    """Download an object into the cache (keyed by bucket, key and ETag); (path, was_cached)."""
    bucket, key = split_s3(uri)
    stored = head(uri)
    target = _cached_object(uri, stored["ETag"].strip('"'), cache_dir)
    if target.is_file():
        return target, True
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as tmp:
        partial = Path(tmp.name)
    try:
        with Progress(stored["ContentLength"], f"download {uri}", unit="B") as progress:
            _s3_call(
                uri,
                client().download_file,
                bucket,
                key,
                str(partial),
                Config=_transfer_config(),
                Callback=progress.update,
            )
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target, False


def fetch_tree(uri: str, cache_dir: Path) -> tuple[Path, bool]:
    """Download every object under a prefix into a cached directory; (path, was_cached)."""
    bucket, prefix = split_s3(uri)
    prefix = prefix if prefix.endswith("/") or not prefix else prefix + "/"
    listing = list_keys(f"s3://{bucket}/{prefix}")
    if not listing:
        raise AmpbenchError(f"{uri}: no objects under this prefix")
    manifest = json.dumps(sorted(listing)).encode()
    digest = hashlib.sha256(f"{bucket}\0{prefix}\0".encode() + manifest).hexdigest()[:32]
    target = _cache_root(cache_dir) / digest / "tree"
    if target.is_dir():
        return target, True
    wanted = []
    for key, _, _ in listing:
        relative = key[len(prefix) :]
        if not relative or relative.endswith("/"):
            continue
        # "prefix//etc/x" leaves an absolute path, which `staging / relative` would obey.
        if relative.startswith("/") or ".." in PurePosixPath(relative).parts:
            raise AmpbenchError(f"{uri}: object key '{key}' points outside the prefix")
        wanted.append((key, relative))
    # Staged next to the target: the final rename must not cross filesystems.
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".staging-"))
    try:
        for key, relative in wanted:
            local = staging / relative
            local.parent.mkdir(parents=True, exist_ok=True)
            _s3_call(uri, client().download_file, bucket, key, str(local))
        try:
            os.replace(staging, target)
        except OSError:
            if not target.is_dir():
                raise
            return target, True  # another process fetched the same tree meanwhile
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target, False


def _expected_sha256(path: Path, composite: bool) -> str:
    """A SHA-256 checksum as S3 keeps it, base64: of the file, or (composite) of the digests
    of its parts as our transfer config cuts them."""
    with path.open("rb") as f:
        if not composite:
            return base64.b64encode(hashlib.file_digest(f, "sha256").digest()).decode()
        digests = [
            hashlib.sha256(chunk).digest() for chunk in iter(lambda: f.read(MULTIPART_CHUNK), b"")
        ]
    return base64.b64encode(hashlib.sha256(b"".join(digests)).digest()).decode()


# What a store that keeps no additional checksums may answer a request that sends one.
CHECKSUM_UNSUPPORTED = (
    "MissingContentLength",
    "InvalidArgument",
    "NotImplemented",
    "InvalidRequest",
)


def _upload_file(path: Path, uri: str, checksum: bool) -> None:
    bucket, key = split_s3(uri)
    extra = {"ChecksumAlgorithm": "SHA256"} if checksum else {}
    client().upload_file(str(path), bucket, key, ExtraArgs=extra, Config=_transfer_config())


def upload(path: Path, uri: str) -> str:
    """Upload one file (multipart when large) and verify what the store can answer: the SHA-256
    checksum where it keeps additional checksums (AWS S3, MinIO, Ceph 19+), else the size.
    Return which ("sha256" or "size"). ETags are not compared: under SSE-KMS, and for multipart
    uploads on some stores, an ETag is no MD5 of the content."""
    from boto3.exceptions import Boto3Error
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        _upload_file(path, uri, checksum=True)
    except (ClientError, BotoCoreError, Boto3Error) as error:
        if not any(f"({code})" in str(error) for code in CHECKSUM_UNSUPPORTED):
            raise describe_error(uri, error) from None
        log.debug("%s: the store refused a checksummed upload (%s); sent without", uri, error)
        _s3_call(uri, _upload_file, path, uri, checksum=False)
    bucket, key = split_s3(uri)
    stored = _s3_call(uri, client().head_object, Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    size = path.stat().st_size
    if stored["ContentLength"] != size:
        raise AmpbenchError(
            f"{uri}: upload verification failed (stored {stored['ContentLength']} bytes, "
            f"sent {size})"
        )
    checksum = stored.get("ChecksumSHA256")
    if not checksum:
        return "size"
    # A multipart upload's checksum is composite (AWS writes "digest-N"; other stores drop
    # the suffix) or of the full object (stores that support FULL_OBJECT): either must match.
    expected = {_expected_sha256(path, composite=False)}
    if size >= MULTIPART_CHUNK:
        expected.add(_expected_sha256(path, composite=True))
    if checksum.partition("-")[0] not in expected:
        raise AmpbenchError(f"{uri}: upload verification failed (SHA-256 differs from the file)")
    return "sha256"


@contextlib.contextmanager
def writing(location: str) -> Iterator[Path]:
    """A local file to write `location`'s contents into: when the block ends it is put in
    place whole (renamed into a local folder, or uploaded), so that readers of a shared
    location never see part of it; if the block raises, nothing is written."""
    if is_s3(location):
        with tempfile.TemporaryDirectory() as scratch:
            local = Path(scratch) / PurePosixPath(location).name
            local.touch()  # as a local file starts: a block that writes nothing puts it empty
            yield local
            upload(local, location)
        return
    folder = Path(location).parent
    folder.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(dir=folder, prefix=".partial-")
    os.close(handle)
    try:
        yield Path(partial)
        _fsync(partial)  # on disk before it has the name, and the name after
        os.replace(partial, location)
        _fsync(folder)
    finally:
        Path(partial).unlink(missing_ok=True)


def _fsync(path: str | Path) -> None:
    handle = os.open(path, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def copy_file(path: Path, target: str) -> str:
    """Copy one local file to an s3:// URI (verified upload) or a local path."""
    if is_s3(target):
        upload(path, target)
    else:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    return target


def copy_tree(local_dir: Path, destination: str, names: list[str] | None = None) -> list[str]:
    """Copy a local directory (or only its entries `names`, files or folders) to an s3://
    prefix or a local directory; return what was written."""
    roots = [local_dir / name for name in names] if names is not None else [local_dir]
    files = sorted(
        file
        for root in roots
        for file in ([root] if root.is_file() else root.rglob("*"))
        if file.is_file()
    )
    return [
        copy_file(file, join(destination, file.relative_to(local_dir).as_posix())) for file in files
    ]


def read_bytes(location: str) -> bytes:
    """The file's or object's bytes; a missing object is one line naming it."""
    try:
        return _read(location)
    except _Missing as missing:
        raise describe_error(location, missing.error) from None


def read_bytes_if_any(location: str) -> bytes | None:
    """The file's or object's bytes; None where there is none (any other failure raises)."""
    try:
        return _read(location)
    except (_Missing, FileNotFoundError):
        return None


def _read(location: str) -> bytes:
    if not is_s3(location):
        return Path(location).read_bytes()
    bucket, key = split_s3(location)
    response = _s3_call(location, _get_object, bucket, key)
    return _s3_call(location, response["Body"].read)


class _Missing(Exception):
    """No object at the key: an error for read_bytes, None for read_bytes_if_any."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _get_object(bucket: str, key: str) -> Any:
    from botocore.exceptions import ClientError

    try:
        return client().get_object(Bucket=bucket, Key=key)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
            raise _Missing(error) from None
        raise


def remove(location: str) -> None:
    if not is_s3(location):
        Path(location).unlink(missing_ok=True)
        return
    bucket, key = split_s3(location)
    _s3_call(location, client().delete_object, Bucket=bucket, Key=key)
