"""Stable download links of the model registry: `GET /_torchdeck/models/<name>@<alias>/<file>` and
`GET /_torchdeck/models/<name>/<version>/<file>`.

The alias is resolved when the request comes (app.services.registry.resolve): a link to `digits@production` serves
whichever version `production` points at at that moment, so a deployment that fetches it by name gets the new
model after an alias move without changing its link. The file is one of the version's (its exports, report,
bundle, by the name the version lists), streamed exactly as the artifact route streams it (app/web/downloads.py:
the same admission, a piece at a time, its SHA-256 re-checked before the first byte and on the way), and it must
still be the file the version recorded (the artifact's registered SHA-256 equals the version's). In team mode the
model's project must be one the signed-in person may read (app/web/access.py); to anyone else the model does not
exist (the same 404 and words as a name nobody registered).

Mounted beside the artifact route where app/server.py mounts it (`torchdeck ui`, `torchdeck up`).
"""

from __future__ import annotations

from urllib.parse import quote

from app.web import downloads

PATH = "/_torchdeck/models"


def routes() -> list:
    from starlette.routing import Route

    return [
        Route(PATH + "/{name}/{version:int}/{filename}", download, methods=["GET"]),
        Route(PATH + "/{ref}/{filename}", download, methods=["GET"]),
    ]


def url(name: str, ref: str | int, filename: str) -> str:
    """`/_torchdeck/models/digits@production/model.onnx` for an alias, `/_torchdeck/models/digits/3/model.onnx`
    for a version number."""
    where = f"{quote(name, safe='')}/{int(ref)}" if str(ref).isdigit() else f"{quote(name, safe='')}@{quote(ref)}"
    return f"{PATH}/{where}/{quote(filename, safe='')}"


def _target(params) -> tuple[str, str | int]:
    from app.services.registry import check_alias

    if "version" in params:
        return params["name"], params["version"]
    name, at, alias = str(params["ref"]).partition("@")
    if not at:
        raise ValueError("name a version as <name>/<version>/<file> or an alias as <name>@<alias>/<file>")
    return name, check_alias(alias)  # `digits@1` is not version 1: a version is a path segment of its own


def download(request):
    """The route: the version's file streamed, or a plain-text refusal (403, 400, 404, 409)."""
    from app.services import registry
    from app.web import access
    from db.errors import ArtifactNotFound
    from db.repo import get_artifact

    user, why = downloads.admitted(request)
    if why is not None:
        return downloads._plain(403, why)
    try:
        name, ref = _target(request.path_params)
        if not access.may_read(user, "model", name, registry.get_engine()):
            raise registry.ModelNotFound(name)
        version = registry.resolve(name, ref)
        entry = registry.version_file(version, request.path_params["filename"])
    except (ValueError, registry.RegistryRefused) as e:
        return downloads._plain(400, f"Refused: {e}.")
    except (registry.ModelNotFound, registry.VersionNotFound) as e:
        return downloads._plain(404, f"Refused: {_not_found(e)}.")
    try:
        stored = get_artifact(registry.get_engine(), entry["artifact_id"])
    except ArtifactNotFound:
        return downloads._plain(
            404,
            f"Refused: version {version.version} of {name}'s {entry['filename']} is gone (no artifact of that id is "
            "recorded now).",
        )
    if stored.sha256 != entry.get("sha256"):
        return downloads._plain(
            409, f"Refused: {entry['filename']} is not the file version {version.version} of {name} registered."
        )
    return downloads.stream(entry["artifact_id"], filename=entry["filename"])


def _not_found(e: LookupError) -> str:
    from app.services import registry

    if isinstance(e, registry.ModelNotFound):
        return f"there is no registered model {str(e.args[0])[:100]!r}"
    return str(e)
