"""A bundle's manifest.json: its fields, declared once for `pictl bundle`, which writes it, and for `pictl verify`
and `pictl board`, which read it.

The manifest is written with sorted keys (`to_bytes`), so the bytes do not depend on the order fields are declared
in. Read back (`BundleManifest.view`), every value is taken as the file holds it, neither coerced nor checked: a
bundle's manifest is trusted only once its signature holds, and each check reads the fields it needs and names
what is wrong with them itself (a field missing reads as None).
"""

from __future__ import annotations

import json
from typing import Any

from pictl.summary_figures import Open

__all__ = ["BundleManifest", "BundledArtifact", "ManifestSigner"]


class BundledArtifact(Open):
    """The run's model artifact: carried in the bundle (`artifact/<name>`) when small enough, else named by its
    digest only (the verifier needs its own copy)."""

    name: str | None = None
    digest: str | None = None
    """The run summary's digest of the artifact."""
    bundled: bool = False
    sha256: str | None = None
    """The bundled file's sha256 (only when `bundled`)."""
    size: int | None = None
    missing: bool | None = None
    """The artifact's file was gone when the run was bundled."""


class ManifestSigner(Open):
    """The key that signed the bundle, as its maker gave it (the check trusts `ssh-keygen -Y verify`, not this)."""

    key: str | None = None
    """The public key line, `TYPE BASE64 COMMENT`: the board names an unnamed team by its comment."""
    fingerprint: str | None = None


class BundleManifest(Open):
    """manifest.json: what the signature covers, and through `members` every other member by its sha256."""

    format: str | None = None
    version: int | None = None
    run_id: str | None = None
    team: str | None = None
    """`pictl bundle --team` (None: the board names the signer)."""
    created_at: float | None = None
    code: str | None = None
    """The digest of the bundled code (`pictl.cluster.push.manifest_digest`): the run summary's `code`."""
    artifact: BundledArtifact | None = None
    outputs_sha256: str | None = None
    """The sha256 of the outputs the run was judged by (`Bundle.outputs`), None when it kept none."""
    signer: ManifestSigner | None = None
    suspect_because: str | None = None
    """The run's own SUSPECT verdict's reason, None for a result pictl found sound."""
    members: dict[str, str] | None = None
    """Every member but the manifest and its signature: name -> sha256."""

    def to_bytes(self) -> bytes:
        """manifest.json's bytes: the fields given, keys sorted (what the signature is made over)."""
        return json.dumps(self.written(), indent=1, sort_keys=True).encode()

    def artifact_record(self) -> BundledArtifact | None:
        """The artifact's record read by field (as the file holds it), None when the manifest names none."""
        found: Any = self.artifact  # (read back: the object as written, viewed here through its model)
        return found if isinstance(found, BundledArtifact) else BundledArtifact.view(found) if isinstance(
            found, dict) else None

    def signer_record(self) -> ManifestSigner | None:
        """The signer's record read by field (as the file holds it), None when the manifest has none."""
        found: Any = self.signer
        return found if isinstance(found, ManifestSigner) else ManifestSigner.view(found) if isinstance(
            found, dict) else None
