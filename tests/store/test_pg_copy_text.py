"""COPY's text format as `store/postgres/bulk.py` writes it by hand: any text a submit may
carry reaches the table unchanged, through a real COPY on a real server."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cairnqd.store.postgres.bulk import copy_field

# What a checked submit's text may hold: any character but NUL and lone surrogates,
# with COPY's own special characters (and look-alikes of its escapes) made common.
_SPECIAL = st.sampled_from(["\\", "\t", "\n", "\r", "\\N", "\\.", "N", ".", "\x0b", "\u2028"])
_TEXT = st.lists(
    st.one_of(_SPECIAL, st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")),
    min_size=1,
    max_size=12,
).map("".join)


@pytest.fixture
def conn(pg_dsn: str) -> Iterator[psycopg.Connection[tuple[str]]]:
    with psycopg.connect(pg_dsn, autocommit=True) as connection:
        connection.execute("create table copied (n integer, t text)")
        yield connection


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_TEXT, min_size=1, max_size=5))
def test_every_text_reads_back_as_written(
    conn: psycopg.Connection[tuple[str]], texts: list[str]
) -> None:
    conn.execute("truncate copied")
    lines = "".join(f"{n}\t{copy_field(text)}\n" for n, text in enumerate(texts))
    with conn.cursor().copy("copy copied (n, t) from stdin") as copy:
        copy.write(lines)
    rows = conn.execute("select t from copied order by n").fetchall()
    assert [t for (t,) in rows] == texts
