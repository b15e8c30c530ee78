-- Releases take a bounded number of locks.
--
-- mink_release_objects (0008) took an advisory lock per key whose index rows went, all
-- held to the end of the transaction. PostgreSQL's lock table holds about
-- max_locks_per_transaction x max_connections locks (6,400 by default, shared by every
-- session): a statement deleting the rows of tens of thousands of objects (a topic
-- deleted with a long history in WAL objects, a tiering swap of a round's 20,000 rows,
-- retention after a backlog) failed with "out of shared memory", every time it was tried,
-- and while it held thousands of locks other sessions' could fail too. The locks only
-- serialize releasers of the same key (two transactions deleting the last rows of one
-- shared WAL object in two partitions: the second, once the first has committed, sees its
-- deletion and releases the object). They are now taken on one of RELEASE_BUCKETS buckets
-- of the key's hash (lock space 7302): the same exclusion, at most 64 locks whatever the
-- rows. Nothing else takes these buckets: CommitWal's and collection's key locks (7301)
-- are about keys being decided or deleted, which a release never races (an old committed
-- key gets no new index row; one queued twice is queued once, ON CONFLICT).

CREATE OR REPLACE FUNCTION mink_release_objects(p_keys text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(cardinality(p_keys), 0) = 0 THEN
        RETURN;
    END IF;
    -- RELEASE_BUCKETS = 64, in order: no two releasers wait on each other in a cycle
    PERFORM pg_advisory_xact_lock(7302, s.bucket)
       FROM (SELECT DISTINCT hashtext(k) & 63 AS bucket FROM unnest(p_keys) AS k
              ORDER BY 1) AS s;
    WITH unused AS (
        SELECT DISTINCT k AS key FROM unnest(p_keys) AS k
         WHERE NOT EXISTS (SELECT 1 FROM batch_index AS b WHERE b.object_key = k)
    ), marked AS (
        UPDATE wal_objects AS w SET gc_queued_at = now()
          FROM unused AS u WHERE w.key = u.key AND w.gc_queued_at IS NULL
    )
    INSERT INTO unreferenced_objects (key)
    SELECT key FROM unused
    ON CONFLICT (key) DO NOTHING;
END $$;
