"""A SQLite store that cannot be opened says why, not only the driver's "unable to open database
file"."""

from __future__ import annotations

import pytest

from store import Store, StoreUnavailable


@pytest.mark.parametrize(
    ("path", "cause"),
    [
        (
            "/proc/x.db",
            "/proc/x.db: No such file or directory; /proc is a kernel filesystem: no store can be kept there",
        ),
    ],
)
async def test_a_store_under_a_kernel_filesystem_names_its_cause(path: str, cause: str) -> None:
    store = Store(f"sqlite://{path}")
    try:
        with pytest.raises(StoreUnavailable) as e:
            await store.init()
    finally:
        await store.close()
    assert str(e.value) == (
        f"storage sqlite://{path}: cannot open the database (OperationalError: unable to open "
        f"database file; {cause})"
    )
