"""What a Hub listing or an object-store prefix may plan (issue 37): a bounded number of files, and
names that stay inside the destination, refused before anything is fetched.

The cap (api.MAX_FILES, one copy's files; the OCI archives' entry cap is the same number) is
lowered through `Options.max_files` so a listing one over it stays a few objects; the product's
value is asserted on its own. The Hub is testkit/hub.py's on loopback, S3 is moto in server mode.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import pytest
from praesto.agent.download import LastingDownloadError, Options, unpack
from praesto.agent.download.api import MAX_FILES
from praesto.agent.download.fetch import plan

from praesto.spec import MAX_PATTERN_CHARS, MAX_PATTERNS, Source, parse_uri
from testkit.egress import LOOPBACK
from testkit.hub import LocalHub
from testkit.s3server import ADMIN_KEY, S3Server
from tests.download.conftest import options_for

BUCKET = "models"
CAP = 5
LISTED = 2_000  # x 2 * MAX_PATTERNS worst-case patterns: about 1 s here; exponential matching never ends
PLAN_DEADLINE = 60.0
UNSAFE_KEYS = ("../evil.txt", "a/../../evil", "dir\\..\\evil", ".praesto-complete", "a//b", "/abs", "./x")


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with S3Server(tmp_path_factory.mktemp("moto")) as server:
        server.client().create_bucket(Bucket=BUCKET)
        yield server


def _src(uri: str) -> Source:
    source, errors = parse_uri(uri)
    assert source is not None and not errors
    return source


def _s3_options(s3: S3Server, **kwargs: object) -> Options:
    creds = {"AWS_ACCESS_KEY_ID": ADMIN_KEY[0], "AWS_SECRET_ACCESS_KEY": ADMIN_KEY[1]}
    return Options(credentials={**creds, "AWS_ENDPOINT_URL": s3.endpoint}, egress=LOOPBACK, **kwargs)  # type: ignore[arg-type]


def _put(s3: S3Server, prefix: str, names: list[str]) -> None:
    client = s3.client()
    for name in names:
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/{name}", Body=b"x")


def test_the_cap_is_one_number_for_listings_and_archives() -> None:
    assert MAX_FILES == 100_000
    assert Options().max_files == MAX_FILES
    assert unpack.MAX_ENTRIES == MAX_FILES


def test_a_hub_listing_over_the_cap_is_refused_naming_the_count_and_the_fix(hub: LocalHub) -> None:
    hub.add_repo("org/many", {f"shard-{i}.bin": b"x" for i in range(CAP + 1)})
    with pytest.raises(LastingDownloadError) as info:
        plan(_src("hf://org/many"), options_for(hub, max_files=CAP))
    assert info.value.reason == "InvalidRepoFile"
    assert info.value.message == (
        f"hf://org/many: {CAP + 1} files to fetch, more than the {CAP} one copy may hold; "
        "select fewer with spec.source.huggingface.allowPatterns or ignorePatterns"
    )
    # The cap counts what is selected, not what is listed.
    selected = dataclasses.replace(_src("hf://org/many"), ignore_patterns=("shard-0.bin",))
    assert len(plan(selected, options_for(hub, max_files=CAP)).files) == CAP


def test_an_object_store_prefix_over_the_cap_is_refused(s3: S3Server) -> None:
    _put(s3, "many", [f"part-{i}" for i in range(CAP + 1)])
    with pytest.raises(LastingDownloadError) as info:
        plan(_src(f"s3://{BUCKET}/many"), _s3_options(s3, max_files=CAP))
    assert info.value.reason == "InvalidRepoFile"
    assert info.value.message == (
        f"s3://{BUCKET}/many: {CAP + 1} files to fetch, more than the {CAP} one copy may hold; "
        "point the URI at a prefix holding fewer"
    )
    assert len(plan(_src(f"s3://{BUCKET}/many"), _s3_options(s3, max_files=CAP + 1)).files) == CAP + 1


@pytest.mark.parametrize("key", UNSAFE_KEYS)
def test_unsafe_object_keys_are_refused_for_good_naming_the_key(s3: S3Server, key: str) -> None:
    prefix = f"unsafe-{UNSAFE_KEYS.index(key)}"
    _put(s3, prefix, ["ok.txt", key])
    with pytest.raises(LastingDownloadError) as info:  # lasting: a store outage would be retried for ever
        plan(_src(f"s3://{BUCKET}/{prefix}"), _s3_options(s3))
    assert info.value.reason == "InvalidRepoFile"
    assert repr(key)[1:-1] in info.value.message
    assert "would escape the destination" in info.value.message


def test_the_largest_pattern_lists_plan_a_large_listing_in_bounded_time(hub: LocalHub) -> None:
    """Every listed file meets every pattern: MAX_PATTERNS on each side, each MAX_PATTERN_CHARS of the
    shape that backtracks worst (`*a*a...b` on names of a's), and fnmatch stays linear in them."""
    worst = ("*a" * MAX_PATTERN_CHARS)[: MAX_PATTERN_CHARS - 1] + "b"
    assert len(worst) == MAX_PATTERN_CHARS
    files = {f"{'a' * 200}/{i:04d}-{'a' * 40}.bin": b"x" for i in range(LISTED)}
    hub.add_repo("org/wide", files)
    source = dataclasses.replace(
        _src("hf://org/wide"),
        allow_patterns=(*[worst] * (MAX_PATTERNS - 1), "*"),  # the match comes last: every pattern is tried
        ignore_patterns=(worst,) * MAX_PATTERNS,
    )
    started = time.monotonic()
    planned = plan(source, options_for(hub))
    elapsed = time.monotonic() - started
    assert len(planned.files) == LISTED
    assert elapsed < PLAN_DEADLINE, f"{LISTED} files x {2 * MAX_PATTERNS} patterns took {elapsed:.1f} s"
