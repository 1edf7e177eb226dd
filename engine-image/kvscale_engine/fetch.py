"""`kvscale-engine fetch`: downloads a Hugging Face Hub repository into a pod's model volume.

The init container of an endpoint whose model source is `huggingface` runs it. huggingface_hub's
`snapshot_download` writes the Hub's cache layout under `--cache-dir` (models--org--name/blobs,
snapshots/<commit>, refs/<revision>), honours HF_ENDPOINT and HF_TOKEN, and downloads only what
the cache lacks, so a PersistentVolumeClaim is filled once and then reused. `--link` then points
at the snapshot of the requested revision: the path the engine serves from.

The exit code says what went wrong, for the operator's `Degraded` reason (kvscale.children.
engine_args.FETCH_EXIT_CODES mirrors these; a unit test checks they agree).
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

NOT_FOUND = 3  # no such repository or revision
ACCESS_DENIED = 4  # the token is missing, wrong, or not allowed the repository
FAILED = 1  # anything else (network, disk)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    fetch = sub.add_parser("fetch", help="download a Hugging Face Hub repository (init container)")
    fetch.add_argument("--repo", required=True, help="repository id, e.g. org/name")
    fetch.add_argument("--revision", default="main", help="branch, tag or commit")
    fetch.add_argument("--cache-dir", type=Path, required=True, help="the Hub cache to fill")
    fetch.add_argument("--link", type=Path, required=True, help="symlink to the snapshot")


def link_snapshot(snapshot: Path, link: Path) -> None:
    """Point `link` at `snapshot` (relative, so it resolves wherever the volume is mounted),
    replacing an older link atomically."""
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.tmp")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(os.path.relpath(snapshot, link.parent))
    tmp.replace(link)


def fetch(args: argparse.Namespace) -> int:
    """Download; return the exit code."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{args.repo}@{args.revision} from {os.environ.get('HF_ENDPOINT', 'the Hub')}"
    try:
        path = snapshot_download(args.repo, revision=args.revision, cache_dir=args.cache_dir)
    except (RepositoryNotFoundError, RevisionNotFoundError) as err:
        # the Hub answers a private repository without a token as a missing one
        log.error("Found no %s: %s", where, err)
        return NOT_FOUND
    except GatedRepoError as err:
        log.error("Access to %s denied: %s", where, err)
        return ACCESS_DENIED
    except HfHubHTTPError as err:
        status = err.response.status_code if err.response is not None else None
        log.error("Failed to download %s (HTTP %s): %s", where, status, err)
        return ACCESS_DENIED if status in (401, 403) else FAILED
    except Exception as err:  # network, disk: the init container fails and is retried
        log.error("Failed to download %s: %s", where, err)
        return FAILED
    link_snapshot(Path(path), args.link)
    log.info("Downloaded %s into %s", where, path)
    return 0
