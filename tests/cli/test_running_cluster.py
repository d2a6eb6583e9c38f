"""The notes by which `pdserve status` finds the clusters `pdserve up` runs (cli.running_cluster), in a temporary
folder: a locked note is a running cluster, an unlocked one is left over and goes; none or several is an error that
says so."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from cli.running_cluster import ClusterNote, RunningCluster, notes_folder, running_clusters, the_running_cluster
from common.errors import UnavailableError

A = RunningCluster(101, "127.0.0.1:50051", "redis://127.0.0.1:6400/0")
B = RunningCluster(99, "127.0.0.1:50061", "rediss://:secret@127.0.0.1:6401/0?ssl_ca_certs=/c/ca.pem", "/c/ca.pem")


def test_the_notes_folder_is_under_xdg_runtime_dir_else_the_users_cache() -> None:
    assert notes_folder({"XDG_RUNTIME_DIR": "/run/user/7", "HOME": "/home/u"}) == Path("/run/user/7/pdserve/clusters")
    assert notes_folder({"XDG_RUNTIME_DIR": "", "HOME": "/home/u"}) == Path("/home/u/.cache/pdserve/clusters")


def test_a_written_note_is_private_found_while_held_and_gone_once_removed(tmp_path: Path) -> None:
    folder = tmp_path / "clusters"
    note = ClusterNote.write(folder, A)
    assert note.path == folder / "101.json" and sorted(p.name for p in folder.iterdir()) == ["101.json"]
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and stat.S_IMODE(note.path.stat().st_mode) == 0o600
    assert running_clusters(folder) == [A] and the_running_cluster(folder) == A
    note.remove()
    assert running_clusters(folder) == [] and list(folder.iterdir()) == []


def test_an_unlocked_note_is_left_over_from_a_killed_pdserve_up_and_is_deleted(tmp_path: Path) -> None:
    (tmp_path / "7.json").write_text(json.dumps({"pid": 7, "router_address": "a:1", "redis_url": "redis://b:2/0"}))
    note = ClusterNote.write(tmp_path, B)
    assert running_clusters(tmp_path) == [B]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["99.json"]
    note.remove()


def test_none_or_several_running_clusters_are_errors_that_say_so(tmp_path: Path) -> None:
    with pytest.raises(UnavailableError) as none:
        the_running_cluster(tmp_path / "never-made")
    assert str(none.value) == (
        "no `pdserve up` cluster is running on this machine; start one, or name a cluster's Redis with --redis-url "
        "URL (or PDSERVE_REDIS_URL)"
    )
    notes = [ClusterNote.write(tmp_path, A), ClusterNote.write(tmp_path, B)]
    with pytest.raises(UnavailableError) as several:
        the_running_cluster(tmp_path)
    assert str(several.value) == (
        "2 `pdserve up` clusters are running on this machine (router 127.0.0.1:50061, Redis "
        "rediss://:***@127.0.0.1:6401/0?ssl_ca_certs=/c/ca.pem (pdserve up, pid 99); router 127.0.0.1:50051, Redis "
        "redis://127.0.0.1:6400/0 (pdserve up, pid 101)); name one's Redis with --redis-url URL"
    )
    for note in notes:
        note.remove()
