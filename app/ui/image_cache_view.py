"""The Datasets page's "Image cache on this machine": the image folders that runs on this machine decoded once and
keep (app/services/image_cache.py), their size on disk, and removing them (an admin's, in team mode)."""

from __future__ import annotations

from datetime import datetime

import pandas as pd
import streamlit as st

from app import auth
from app.present import text as f
from app.services import image_cache as cache
from app.ui import frame, project_context

K = frame.page_state("imgcache")


def _where() -> str:
    if auth.team_mode():
        return (
            "This machine's cache: runs here decode an image folder once and read it back from here; a worker on "
            "another machine keeps its own."
        )
    return "This machine's cache, shared by the local workers: runs decode an image folder once and read it from here."


def _table(entries: list[cache.CacheEntry]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "dataset": e.source,
                "part": e.part,
                "mode": e.mode,
                "side (px)": e.side,
                "images": e.images,
                "size (MB)": round(e.bytes / 2**20, 2),
                "last used": datetime.fromtimestamp(e.last_used).replace(microsecond=0),
                "key": e.key,
            }
            for e in entries
        ]
    )


def _freed(what: str, freed: int) -> None:
    st.session_state[K("freed")] = f"Removed {what}: freed {f.size(freed)}."
    st.rerun()


def _remove(key: str, what: str, user: auth.User | None) -> None:
    try:
        freed = cache.remove(key, by=user)
    except auth.PermissionDenied as e:
        st.error(f.md_text(e), icon=":material/block:")
        return
    except KeyError:
        st.info(f"{f.md_text(what)} was already gone (removed, or replaced by a run on changed data).")
        return
    _freed(what, freed)


def _remove_all(user: auth.User | None, count: int) -> None:
    with st.popover("Remove all", icon=":material/delete_sweep:"):
        st.warning(f"Remove all {count} entries? The next run on each dataset decodes its images again.")
        if not st.button("Remove all permanently", type="primary", key=K("clear")):
            return
        try:
            freed = cache.clear(by=user)
        except auth.PermissionDenied as e:
            st.error(f.md_text(e), icon=":material/block:")
            return
    _freed(f"all {count} entries", freed)


def _removers(entries: list[cache.CacheEntry], user: auth.User | None) -> None:
    for e in entries:
        what = f"{e.source} ({e.part}, {e.mode}, {e.side} px)"
        left, right = st.columns([5, 1], vertical_alignment="center")
        left.markdown(
            f"{f.code_span(e.source)} · {f.md_text(e.part)} · {f.md_text(e.mode)} · {e.side} px · {f.size(e.bytes)}"
        )
        if right.button("Remove", key=K(f"rm.{e.key}"), icon=":material/delete:"):
            _remove(e.key, what, user)
    _remove_all(user, len(entries))


def section() -> None:
    st.subheader("Image cache on this machine")
    done = st.session_state.pop(K("freed"), None)
    if done:
        st.success(f.md_text(done), icon=":material/check_circle:")
    root = cache.root()
    if root is None:
        st.caption(f"The image cache is off on this machine ({cache.ENV}=off): runs decode their images every time.")
        return
    entries = cache.entries()
    if not entries:
        st.caption(f"This machine's image cache ({f.code_span(root)}) is empty.")
        return
    st.markdown(
        f"**{f.size(cache.total_bytes(entries))}** in {len(entries)} entr{'y' if len(entries) == 1 else 'ies'} "
        f"at {f.code_span(root)} ({cache.ENV}). {_where()}"
    )
    st.dataframe(_table(entries), hide_index=True, width="stretch")
    user = project_context.acting()
    if not cache.can_remove(user):
        st.caption("Only an admin may remove image cache entries.")
        return
    with st.expander("Remove entries (a run rebuilds an entry when it needs it again)"):
        _removers(entries, user)
