"""The object store's own checksum of each object, read at plan time with one HEAD per object.

Listings carry none (only S3's single-part ETag is an MD5), and `obstore` does not expose
the headers that do, so each object without a cryptographic digest is HEADed here:

* S3: `x-amz-checksum-{sha256,sha1,crc64nvme,crc32c,crc32}` when the request carries
  `x-amz-checksum-mode: ENABLED`. S3 refuses that header unsigned on a presigned URL, so the
  request is signed SigV4 with botocore (AWS's own signer and credential chain) from the
  same credential the store uses. A multipart object's checksum counts only when S3 calls it
  FULL_OBJECT: a COMPOSITE one (or one without a type) covers the parts' checksums.
* GCS: `x-goog-hash: crc32c=…,md5=…` (composite objects have only the CRC32C).
* Azure: `Content-MD5`, when the uploader set it (a single-shot upload always does).

GCS and Azure requests use a URL `obstore.sign` made (a V4 signed URL, a SAS), so no second
credential path exists. A digest counts only if the HEAD answered with the planned ETag
(the object was not replaced in between). Anything that fails leaves the file as it was:
fetched from the origin only, never from peers, which is safe; the reason is logged.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import timedelta
from email.message import Message
from typing import Literal
from urllib.parse import quote, urlencode

import obstore
from obstore.exceptions import BaseError
from obstore.store import AzureStore, GCSStore, S3Store
from praesto.agent.download.api import RemoteFile
from praesto.agent.download.digests import StoreDigest, from_base64
from praesto.agent.download.egress import EgressPolicy
from praesto.agent.download.http import Transient, Transport, redact
from praesto.agent.download.origins.objstore.creds import StoreConfig

log = logging.getLogger("praesto.download")
CONCURRENCY = 16
SIGNED_FOR = timedelta(minutes=10)
# Strongest first: a cryptographic digest lets peers supply the file; a CRC only guards the fetch.
S3_ALGORITHMS = ("sha256", "sha1", "crc64nvme", "crc32c", "crc32")
GCS_ALGORITHMS = ("md5", "crc32c")
Headers = Message  # http.client's response headers: case-insensitive


def with_store_digests(
    store: AzureStore | GCSStore | S3Store,
    cfg: StoreConfig,
    files: tuple[RemoteFile, ...],
    ca_bundle: str | None = None,
    proxies: Mapping[str, str] | None = None,
    egress: EgressPolicy | None = None,
) -> tuple[RemoteFile, ...]:
    """`files` with the store's checksum on each one that has no cryptographic digest yet.
    `ca_bundle`: Options.ca_bundle, trusted by the HEAD requests besides the system roots;
    `proxies`: Options.proxies, which they go through; `egress`: Options.egress, the rule they
    are opened under (None: the default, which refuses every internal address)."""
    egress = egress or EgressPolicy()
    wanted = [f for f in files if not f.cryptographically_verified and f.size > 0]
    if not wanted or cfg.client_options.get("allow_invalid_certificates"):
        return files  # a checksum from a server whose certificate is not checked vouches for nothing
    try:
        head = _s3_head(cfg) if cfg.scheme == "s3" else _signed_head(store, cfg)
    except (ValueError, RuntimeError) as error:
        log.warning("no store checksums for %s: %s", cfg.bucket, error)
        return files
    transport = Transport("", None, timeout=30.0, ca_bundle=ca_bundle, proxies=proxies, egress=egress)
    missed: list[str] = []  # "path: why", for one warning at the end, not one per object
    signing_failed = threading.Event()  # signing fails alike for every object: stop asking

    def digest_of(f: RemoteFile) -> RemoteFile:
        if signing_failed.is_set():
            return f
        try:
            url, headers = head(f)
        except (BaseError, OSError, ValueError, RuntimeError) as error:  # obstore.sign / the SDK's chain
            signing_failed.set()
            missed.append(f"{f.path}: signing the HEAD failed ({type(error).__name__})")
            return f
        try:
            resp = transport.request("HEAD", url, authorized=False, headers=headers)
            resp.read()
        except (Transient, OSError) as error:
            missed.append(f"{f.path}: {error}")
            return f
        if resp.status != 200:
            missed.append(f"{f.path}: HEAD {redact(url)} answered {resp.status}")
            return f
        return _pick(f, resp.headers, cfg.scheme)

    with ThreadPoolExecutor(CONCURRENCY, thread_name_prefix="praesto-digest") as pool:
        found = {f.path: f for f in pool.map(digest_of, wanted)}
    if missed or signing_failed.is_set():
        log.warning(
            "no store checksum read for %d of %d objects in %s (first: %s); they come from the origin only",
            len(wanted) - sum(1 for f in found.values() if f.digest), len(wanted), cfg.bucket, missed[0],
        )  # fmt: skip
    return tuple(found.get(f.path, f) for f in files)


def _pick(f: RemoteFile, headers: Headers, scheme: str) -> RemoteFile:
    etag = headers.get("ETag")
    if f.etag and etag and _bare(etag) != _bare(f.etag):
        log.warning("no store checksum for %s: the object changed since it was listed", f.path)
        return f
    digest = _from_headers(headers, scheme)
    return f if digest is None else replace(f, digest=digest)


def _bare(etag: str) -> str:
    """An ETag as listings and HEADs both print it (Azure lists it unquoted, answers it quoted)."""
    return etag.removeprefix("W/").strip('"')


def _from_headers(headers: Headers, scheme: str) -> StoreDigest | None:
    if scheme == "s3":
        # A multipart object's checksum covers the whole object only when S3 says FULL_OBJECT;
        # COMPOSITE (or no type, as older S3-compatible stores answer) is a checksum of checksums.
        multipart = "-" in headers.get("ETag", "")
        kind = headers.get("x-amz-checksum-type", "" if multipart else "FULL_OBJECT").upper()
        if kind != "FULL_OBJECT":
            return None
        for name in S3_ALGORITHMS:
            header = f"x-amz-checksum-{name}"
            value = headers.get(header)
            if value and "-" not in value:  # "<b64>-<parts>" is a composite one, however labelled
                return from_base64(name, value, header)
        return None
    if scheme == "gs":
        hashes = dict(
            part.strip().split("=", 1) for part in headers.get("x-goog-hash", "").split(",") if "=" in part
        )
        for name in GCS_ALGORITHMS:
            if hashes.get(name):
                return from_base64(name, hashes[name], "x-goog-hash")
        return None
    value = headers.get("Content-MD5")
    return from_base64("md5", value, "Content-MD5") if value else None


def _object_path(f: RemoteFile) -> str:
    return quote(f.key or f.path, safe="/~")


def _signed_head(
    store: AzureStore | GCSStore | S3Store, cfg: StoreConfig
) -> Callable[[RemoteFile], tuple[str, dict[str, str]]]:
    """GCS and Azure: a URL obstore signs (anonymous stores: the plain object URL)."""
    # A GCS V4 signature covers the method; an Azure SAS grants read, which HEAD is.
    method: Literal["HEAD", "GET"] = "HEAD" if cfg.scheme == "gs" else "GET"

    def head(f: RemoteFile) -> tuple[str, dict[str, str]]:
        if cfg.credentialed:
            return str(obstore.sign(store, method, f.key or f.path, SIGNED_FOR)), {}
        if cfg.scheme == "gs":
            base = cfg.config.get("base_url") or "https://storage.googleapis.com"
        else:
            account = cfg.config["account_name"]
            base = cfg.config.get("endpoint") or f"https://{account}.blob.core.windows.net"
        return f"{base}/{cfg.bucket}/{_object_path(f)}", {}

    return head


def _s3_head(cfg: StoreConfig) -> Callable[[RemoteFile], tuple[str, dict[str, str]]]:
    """S3: the object URL obstore would use, signed SigV4 with the checksum-mode header."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    from botocore.session import Session

    config, region = cfg.config, str(cfg.config["region"])
    endpoint = str(config.get("endpoint") or "")
    if config.get("virtual_hosted_style_request"):
        bucket_url = (
            endpoint or f"https://{cfg.bucket}.s3.{region}.amazonaws.com"
        )  # obstore: endpoint names it
    else:
        bucket_url = f"{endpoint or f'https://s3.{region}.amazonaws.com'}/{cfg.bucket}"
    credentials: Credentials | None = None
    if config.get("access_key_id"):
        credentials = Credentials(
            config["access_key_id"], config["secret_access_key"], config.get("session_token")
        )
    elif not config.get("skip_signature"):  # the workload identity: the SDK's own chain, as obstore's
        credentials = Session().get_credentials()
        if credentials is None:
            raise RuntimeError("the workload identity gave no AWS credentials")

    def head(f: RemoteFile) -> tuple[str, dict[str, str]]:
        url = f"{bucket_url}/{_object_path(f)}"
        if f.version:
            url += "?" + urlencode({"versionId": f.version})
        headers = {"x-amz-checksum-mode": "ENABLED"}
        if credentials is None:
            return url, headers
        request = AWSRequest(method="HEAD", url=url, headers=headers)
        S3SigV4Auth(credentials.get_frozen_credentials(), "s3", region).add_auth(request)
        return url, dict(request.headers.items())

    return head
