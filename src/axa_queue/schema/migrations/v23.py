"""Migration 23, additive: the free slots of a rate limit found without numbering the whole
ring. `axa_queue_rate_slots_free` replaces migration 7's `axa_queue_rate_room` in the
claim statements (`EXCHANGE_RATED`, the keyed claim); migration 7's stays as it was
(nothing of this version calls it).

While a name's ring is not yet whole (a name seldom claimed, or just given a limit),
`axa_queue_rate_room` looked for the numbers without a row by numbering every slot of
the ring and sorting them to take the first few: for each rate-limited name, at every
claim. With a limit of 10,000 a second that was 1.2 ms a name a claim, 15 ms at 100,000
(the most a statement asks for): a process handling 100 names each limited to 10,000 a
second drained 1,435 jobs a second instead of about 10,000. Slots are taken lowest
first, so the numbers with a row are those below the count of rows: the new function
takes the numbers from that count up as they are (its one read of the name's rows
tells it the ring has no hole), and walks them one primary-key look at a time only in
a ring with a hole: the work of a claim is the slots it takes."""

from __future__ import annotations

from ...sql.naming import statement
from .migration import Expectations, Migration, body_of

__all__ = ["MIGRATION_23", "RECORD_23", "SETUP_RATE_SLOTS_FREE_FUNCTION"]

SETUP_RATE_SLOTS_FREE_FUNCTION = statement(
    """CREATE OR REPLACE FUNCTION {axa_queue_rate_slots_free}(jobs regclass, slots regclass, job_name text, most integer, per_ms bigint, claim_at timestamptz, want integer)
RETURNS integer[] LANGUAGE plpgsql VOLATILE AS $${body}$$""",
    body="""
DECLARE
    cutoff timestamptz;
    made integer;
    top integer;
    free integer[];
    n integer;
    taken boolean;
    local boolean := slots = to_regclass('"axa_rate_slots"');
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(jobs::oid::text || ' ' || job_name, 1635213689));
    cutoff := COALESCE(claim_at, clock_timestamp()) - per_ms * interval '1 millisecond';
    IF local THEN
        SELECT count(*), max(s.slot), (array_agg(s.slot ORDER BY s.slot) FILTER (WHERE s.at <= cutoff))[1:want]
            INTO made, top, free FROM "axa_rate_slots" s WHERE s.name = job_name AND s.slot < most;
    ELSE
        EXECUTE format('SELECT count(*), max(s.slot), (array_agg(s.slot ORDER BY s.slot) FILTER (WHERE s.at <= $3))[1:$4] '
                       'FROM %s s WHERE s.name = $1 AND s.slot < $2', slots)
            INTO made, top, free USING job_name, most, cutoff, want;
    END IF;
    free := COALESCE(free, '{}');
    IF made < most AND cardinality(free) < want THEN
        IF COALESCE(top, -1) = made - 1 THEN
            free := free || ARRAY(SELECT generate_series(made, least(most, made + want - cardinality(free)) - 1));
        ELSE
            n := made;
            WHILE n < most AND cardinality(free) < want LOOP
                IF local THEN
                    taken := EXISTS (SELECT FROM "axa_rate_slots" s WHERE s.name = job_name AND s.slot = n);
                ELSE
                    EXECUTE format('SELECT EXISTS (SELECT FROM %s s WHERE s.name = $1 AND s.slot = $2)', slots)
                        INTO taken USING job_name, n;
                END IF;
                IF NOT taken THEN
                    free := free || n;
                END IF;
                n := n + 1;
            END LOOP;
        END IF;
    END IF;
    RETURN free;
END
""",
)
"""Up to `want` free slots of `job_name` under a rate limit of `most` claims per `per_ms`
milliseconds: `axa_queue_rate_room`'s answer, lock and snapshot (migration 7), from
the same one read of the name's rows, which also gives their count and highest number.
A ring filled lowest first (every claim takes the lowest free numbers) has its rows at
the numbers below that count, so the numbers from the count up have none: taken as
they are, with no other read. A ring with a hole (rows written by hand) is walked up
from the count, one primary-key look a number, until `want` are found or the ring ends;
the hole itself is left unused, which claims less, never more."""

RECORD_23 = statement("""INSERT INTO {axa_schema_version} (version, name)
    VALUES (23, 'rate slots walked') ON CONFLICT (version) DO NOTHING""")
"""Migration 23 is applied."""

MIGRATION_23 = Migration(
    23,
    "rate slots walked",
    (SETUP_RATE_SLOTS_FREE_FUNCTION,),
    RECORD_23,
    Expectations(
        functions=(
            (
                "axa_queue_rate_slots_free(regclass,regclass,text,integer,bigint,timestamptz,integer)",
                body_of(SETUP_RATE_SLOTS_FREE_FUNCTION),
            ),
        ),
    ),
)
"""Migration 23 and what it makes sure of."""
