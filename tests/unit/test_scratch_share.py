"""Issue 48 §5: what one user's agents' scratch may take of scratch_dir's
filesystem (sandbox/loopfs.prepare, `[sandbox] scratch_user_max`); the bed
side is tests/integration/test_scratch_disk.py."""

from __future__ import annotations


def test_scratch_user_max_bounds_what_one_users_agents_may_take(tmp_path: object) -> None:
    """A start whose scratch would make the user's agents take more than
    their share of scratch_dir's filesystem is refused."""
    import os

    import pytest

    from leviathd.config.load import parse_config
    from leviathd.errors import Unavailable
    from leviathd.sandbox import loopfs

    fd = os.open(str(tmp_path), os.O_TMPFILE | os.O_RDWR, 0o600)
    try:
        st = os.fstatvfs(fd)
        total = st.f_blocks * st.f_frsize
        half = total // 2
        with pytest.raises(Unavailable, match="scratch_user_max"):
            loopfs.prepare(fd, 1 << 20, mine=half, share="50%")
        with pytest.raises(Unavailable, match="scratch_user_max"):
            loopfs.prepare(fd, 2 << 20, mine=0, share=str(1 << 20))
        assert loopfs.user_bound("25%", 400) == 100
    finally:
        os.close(fd)
    cfg = parse_config('[sandbox]\nscratch_user_max = "30%"\n', "m.toml")
    assert cfg.sandbox is not None and cfg.sandbox.scratch_user_max == "30%"
    with pytest.raises(Exception, match="share"):
        parse_config('[sandbox]\nscratch_user_max = "0%"\n', "m.toml")
