"""Models: the current project's registered models (app/services/registry.py). Each model's versions with their
scores side by side and a link to the run each came from, its aliases and their stable download links, who moved
which alias when, and the forms to register a run and move an alias (shown to whom the service would let do it).
`?name=` opens a model; one of another project the user may read switches to that project."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import auth
from app.present import text as f
from app.services import evaluations, registry
from app.services.owners import owner_label, owner_labels
from app.ui import frame, project_context, queries
from app.web import downloads, model_downloads

K = frame.page_state("models")


def versions_frame(versions, aliases: dict[str, int], evaluated: dict[str, list[str]] | None = None) -> pd.DataFrame:
    """One row per version, newest first: its aliases, scores (validation, test, and its run's evaluations on other
    data), files and the run it came from."""
    by_version: dict[int, list[str]] = {}
    for alias, v in aliases.items():
        by_version.setdefault(v, []).append(alias)
    rows = []
    for v in reversed(versions):
        scores = v.lineage.get("scores") or {}
        test = scores.get("test") or {}
        rows.append(
            {
                "version": v.version,
                "aliases": sorted(by_version.get(v.version, [])),
                "best val acc": scores.get("val_acc_best"),
                "test acc": test.get("test/acc"),
                "test F1": test.get("test/f1_macro"),
                "evaluations": (evaluated or {}).get(v.run_id, []),
                "files": [e.get("filename") for e in v.artifacts],
                "dataset": (v.lineage.get("dataset") or {}).get("name"),
                "fingerprint": v.lineage.get("dataset_fingerprint") or "not recorded",
                "commit": (v.lineage.get("git_commit") or "")[:12] or "–",
                "registered": v.created_at,
                "run": f"run?id={v.run_id}",
            }
        )
    return pd.DataFrame(rows)


COLUMNS = {
    "aliases": st.column_config.ListColumn("aliases"),
    "files": st.column_config.ListColumn("files"),
    "evaluations": st.column_config.ListColumn(
        "evaluations",
        help="The newest score of the version's run on each dataset it was evaluated on (the Run page's Evaluate).",
    ),
    "best val acc": st.column_config.NumberColumn("best val acc", format="%.4f"),
    "test acc": st.column_config.NumberColumn("test acc", format="%.4f"),
    "test F1": st.column_config.NumberColumn("test F1", format="%.4f"),
    "registered": st.column_config.DatetimeColumn("registered", format="YYYY-MM-DD HH:mm"),
    "run": st.column_config.LinkColumn("run", display_text="open run ↗", width="small"),
}


def register_form(user: auth.User | None) -> None:
    """Register a run of the project (its members, maintainers and admins; the service checks the run's project)."""
    if not project_context.may_contribute():
        return
    with st.expander("Register a run as a model version", icon=":material/add_box:"):
        st.caption(
            "A run that finished successfully, with at least one verified export (its parity check passed). "
            "A new name creates a model you own; a version of an existing model is added by its owner or an admin."
        )
        left, right = st.columns(2)
        run_id = left.text_input("Run id", key=K("run"), max_chars=64)
        name = right.text_input("Model name", key=K("new_name"), max_chars=100, placeholder="e.g. digits")
        if st.button("Register", icon=":material/add:", key=K("register")):
            try:
                v = registry.register(run_id.strip(), name.strip(), user, queries.engine())
            except registry.RunNotFound:
                st.error(f"There is no run {run_id.strip()[:64]!r}.")
            except (registry.RegistryRefused, auth.PermissionDenied) as e:
                st.error(str(e))
            else:
                st.success(f"{v.model_name} version {v.version} registered.", icon=":material/check_circle:")
                st.query_params["name"] = v.model_name


def alias_form(shown: dict, user: auth.User | None) -> None:
    """Move (or create) an alias: only where the service would allow it."""
    model, versions = shown["model"], shown["versions"]
    if not versions or not registry.may_modify(user, model):
        return
    with st.form(K(f"alias.{model.name}"), border=True):
        st.markdown("**Move an alias**")
        cols = st.columns(3)
        known = sorted(set(shown["aliases"]) | {"production", "staging"})
        alias = cols[0].selectbox("Alias", known, key=K("alias"), accept_new_options=True)
        numbers = [v.version for v in reversed(versions)]
        version = cols[1].selectbox("Version", numbers, key=K("version"))
        if cols[2].form_submit_button("Move", icon=":material/swap_horiz:"):
            try:
                move = registry.set_alias(model.name, str(alias or ""), int(version), user, queries.engine())
            except (registry.RegistryRefused, registry.VersionNotFound, auth.PermissionDenied) as e:
                st.error(str(e))
            else:
                st.success(f"{move.alias}: {move.from_version or '(new)'} → {move.to_version}")
                st.rerun()


def links(shown: dict) -> None:
    """The stable links: by alias (resolved at each download) and by version."""
    name, aliases, versions = shown["model"].name, shown["aliases"], shown["versions"]
    if not versions:
        return
    files = {v.version: [e.get("filename") for e in v.artifacts] for v in versions}
    newest = versions[-1].version
    lines = [model_downloads.url(name, a, fn) for a, v in aliases.items() for fn in files.get(v, [])[:1]]
    lines += [model_downloads.url(name, newest, fn) for fn in files[newest]]
    st.markdown("**Download links** (an alias's link serves whichever version it points at when downloaded)")
    st.code("\n".join(lines), language=None)
    if not downloads.served():
        st.caption("These links are served by `torchdeck ui` and `torchdeck up`; the CLI: `torchdeck models download`.")


def moves_frame(moves) -> pd.DataFrame:
    labels = owner_labels([m.moved_by for m in moves], queries.engine())
    return pd.DataFrame(
        [
            {
                "when": m.moved_at,
                "alias": m.alias,
                "from": m.from_version,
                "to": m.to_version,
                "by": labels.get(m.moved_by, m.moved_by),
            }
            for m in moves
        ]
    )


def model_panel(name: str, user: auth.User | None) -> None:
    try:
        shown = registry.show(name, queries.engine())
    except (registry.ModelNotFound, registry.RegistryRefused):
        st.warning(f"There is no registered model {name[:100]!r}.")
        return
    model = shown["model"]
    st.subheader(f.md_text(model.name))
    aliases = " · ".join(f"`{a}` → {v}" for a, v in shown["aliases"].items()) or "no alias yet"
    st.caption(f"owner {f.md_text(owner_label(model.owner, queries.engine()))} · {aliases}")
    evaluated = evaluations.scores_by_run([v.run_id for v in shown["versions"]], queries.engine())
    frame_ = versions_frame(shown["versions"], shown["aliases"], evaluated)
    st.dataframe(frame_, hide_index=True, column_config=COLUMNS, width="stretch")
    links(shown)
    alias_form(shown, user)
    if shown["moves"]:
        with st.expander("Alias moves", icon=":material/history:"):
            st.dataframe(moves_frame(shown["moves"]), hide_index=True, width="stretch")


def wanted_model() -> str | None:
    """`?name=`: a model of the current project, or of another the user may read (which then becomes current);
    None, saying so, for one that does not exist or that they may not see alike."""
    wanted = st.query_params.get("name")
    if not wanted:
        return None
    try:
        model = registry.readable_model(wanted, by=project_context.acting(), engine=queries.engine())
    except (registry.ModelNotFound, registry.RegistryRefused):
        st.warning(f"There is no registered model {wanted[:100]!r}.")
        return None
    project_context.follow(model.project)
    return model.name


def main() -> None:
    st.title("Models")
    user = project_context.acting()
    wanted = wanted_model()
    models = registry.list_models(queries.engine(), project=project_context.project())
    register_form(user)
    if not models:
        st.caption(
            f"No model registered yet in project {f.md_text(project_context.project())}: register a finished run "
            "above, or `torchdeck models register RUN NAME`."
        )
        return
    names = [m.name for m in models]
    index = names.index(wanted) if wanted in names else 0
    name = st.selectbox("Model", names, index=index, key=K("name"))
    st.query_params["name"] = name
    model_panel(name, user)


main()
