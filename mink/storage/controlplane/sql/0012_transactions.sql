-- Transactions (Kafka's transaction coordinator and its markers), kept in PostgreSQL.
--
-- A transactional id maps to a partition of the internal topic `__transaction_state`; the
-- leader of that partition coordinates it, and every write of its state is fenced by that
-- partition's leader epoch (mink_check_group_coordinator of 0003 checks "this node leads this
-- partition at this leader epoch" for any partition, not only __consumer_offsets').
--
-- The order of a commit (or abort), as Kafka's:
--   1. EndTxn (or a timeout) makes PrepareCommit / PrepareAbort durable: mink_txn_write with a
--      prepare state writes one row in txn_markers per partition of the transaction, in the
--      same transaction; a commit also makes the transaction's pending offsets (TxnOffsetCommit)
--      committed offsets of their groups in that same transaction.
--   2. Each data partition's leader appends a control batch (the marker) through its WAL. The
--      producer state committed with it (mink_commit_wal step 8) carries a small header that
--      the trigger below reads: the marker's row in txn_markers goes, in the WAL commit's own
--      transaction, and an abort adds its range to aborted_transactions. A marker is thus
--      pending exactly until it is durable, and is never written twice.
--      For a group's partition of __consumer_offsets the group coordinator takes the marker
--      (mink_txn_group_marker): its cache learns the offsets the decision committed.
--   3. The last marker gone, the transaction is CompleteCommit / CompleteAbort.
--
-- Nothing here writes the change log: transactions are data, not control plane.

CREATE TABLE transactions (
    transactional_id      text        PRIMARY KEY,
    -- the partition of __transaction_state the id maps to: its leader coordinates it
    coordinator_partition integer     NOT NULL,
    producer_id           bigint      NOT NULL,
    producer_epoch        integer     NOT NULL,
    timeout_ms            integer     NOT NULL,
    -- Empty, Ongoing, PrepareCommit, PrepareAbort, CompleteCommit, CompleteAbort
    state                 text        NOT NULL,
    started_at            timestamptz,            -- when it became Ongoing
    updated_at            timestamptz NOT NULL DEFAULT now(),
    -- grows at each write: the coordinator's compare-and-set
    version               bigint      NOT NULL DEFAULT 0
);
CREATE INDEX transactions_producer ON transactions (producer_id);
CREATE INDEX transactions_partition ON transactions (coordinator_partition, state);

-- The partitions of the ongoing transaction (data partitions, and for AddOffsetsToTxn the
-- group's partition of __consumer_offsets).
CREATE TABLE transaction_partitions (
    transactional_id text    NOT NULL REFERENCES transactions ON DELETE CASCADE,
    topic_id         uuid    NOT NULL,
    partition        integer NOT NULL,
    PRIMARY KEY (transactional_id, topic_id, partition),
    FOREIGN KEY (topic_id, partition) REFERENCES partitions ON DELETE CASCADE
);

-- Markers decided and not yet durable in their partition.
CREATE TABLE txn_markers (
    topic_id         uuid    NOT NULL,
    partition        integer NOT NULL,
    producer_id      bigint  NOT NULL,
    producer_epoch   integer NOT NULL,
    commit           boolean NOT NULL,
    transactional_id text    NOT NULL,
    -- the coordinator's leader epoch when it decided (the marker's coordinator epoch)
    coordinator_epoch integer NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic_id, partition, producer_id),
    FOREIGN KEY (topic_id, partition) REFERENCES partitions ON DELETE CASCADE
);
CREATE INDEX txn_markers_transaction ON txn_markers (transactional_id);

-- The aborted-transaction index: per partition, each aborted transaction's producer, first
-- offset and the offset of its abort marker (Kafka's .txnindex). Fetch under read_committed
-- sends the ones overlapping the range it returns.
CREATE TABLE aborted_transactions (
    topic_id     uuid    NOT NULL,
    partition    integer NOT NULL,
    producer_id  bigint  NOT NULL,
    first_offset bigint  NOT NULL,
    last_offset  bigint  NOT NULL,
    PRIMARY KEY (topic_id, partition, producer_id, first_offset),
    FOREIGN KEY (topic_id, partition) REFERENCES partitions ON DELETE CASCADE
);
CREATE INDEX aborted_transactions_range ON aborted_transactions (topic_id, partition, last_offset);

-- Offsets sent in a transaction (TxnOffsetCommit): pending until the decision; a commit
-- copies them into group_offsets in the decision's transaction (decided = 'commit'), an abort
-- marks them 'abort'; the group coordinator's marker removes them.
CREATE TABLE txn_offsets (
    producer_id           bigint  NOT NULL,
    group_id              text    NOT NULL,
    topic                 text    NOT NULL,
    partition             integer NOT NULL,
    committed_offset      bigint  NOT NULL,
    leader_epoch          integer NOT NULL DEFAULT -1,
    metadata              text,
    coordinator_partition integer NOT NULL,   -- the group's partition of __consumer_offsets
    transactional_id      text    NOT NULL,
    decided               text,               -- NULL (pending), 'commit', 'abort'
    PRIMARY KEY (producer_id, group_id, topic, partition)
);
CREATE INDEX txn_offsets_group ON txn_offsets (group_id);


-- A marker is durable (or not needed): remove it; the transaction completes with its last.
-- Markers of one transaction become durable in concurrent WAL commits (one per leader): a
-- transaction-level advisory lock per transactional id orders them, so that the last one
-- sees the others gone (under READ COMMITTED two concurrent deletes would each still see the
-- other's row, and nobody would complete the transaction). An advisory lock, not the
-- transactions row: the WAL commit holds its partitions' row locks here, and the
-- coordinator's writes take key-share locks on partitions while holding that row.
CREATE FUNCTION mink_txn_marker_done(p_topic_id uuid, p_partition integer, p_producer_id bigint)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_txn text;
BEGIN
    PERFORM pg_advisory_xact_lock(7302, hashtext(m.transactional_id))
       FROM txn_markers AS m
      WHERE m.topic_id = p_topic_id AND m.partition = p_partition
        AND m.producer_id = p_producer_id;
    FOR v_txn IN
        DELETE FROM txn_markers
         WHERE topic_id = p_topic_id AND partition = p_partition AND producer_id = p_producer_id
        RETURNING transactional_id
    LOOP
        IF NOT EXISTS (SELECT 1 FROM txn_markers WHERE transactional_id = v_txn) THEN
            UPDATE transactions
               SET state = CASE state WHEN 'PrepareCommit' THEN 'CompleteCommit'
                                      ELSE 'CompleteAbort' END,
                   updated_at = now(), version = version + 1
             WHERE transactional_id = v_txn AND state IN ('PrepareCommit', 'PrepareAbort');
        END IF;
    END LOOP;
END $$;

-- The coordinator's one write: compare-and-set of a transaction's state (p_expected_version
-- -1: the id has no row yet), fenced by the coordinating partition's leader epoch.
-- p_add_*: partitions joining the transaction. A prepare state decides it (see the top).
-- Empty starts afresh (no partitions). Returns 'ok', 'not_coordinator' or 'conflict'.
CREATE FUNCTION mink_txn_write(p_topic_id uuid, p_partition integer, p_leader_epoch integer,
                               p_node integer, p_node_epoch bigint, p_txn_id text,
                               p_expected_version bigint, p_producer_id bigint,
                               p_producer_epoch integer, p_timeout_ms integer, p_state text,
                               p_add_topics uuid[], p_add_partitions integer[])
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_version bigint;
    v_state   text;
    v_markers integer;
BEGIN
    IF NOT mink_check_group_coordinator(p_topic_id, p_partition, p_leader_epoch, p_node,
                                        p_node_epoch) THEN
        RETURN 'not_coordinator';
    END IF;
    SELECT version, state INTO v_version, v_state FROM transactions
     WHERE transactional_id = p_txn_id FOR UPDATE;
    IF (NOT FOUND AND p_expected_version <> -1) OR (FOUND AND v_version <> p_expected_version) THEN
        RETURN 'conflict';
    END IF;
    INSERT INTO transactions AS t (transactional_id, coordinator_partition, producer_id,
                                   producer_epoch, timeout_ms, state, started_at)
    VALUES (p_txn_id, p_partition, p_producer_id, p_producer_epoch, p_timeout_ms, p_state,
            CASE WHEN p_state = 'Ongoing' THEN now() END)
    ON CONFLICT (transactional_id) DO UPDATE
       SET coordinator_partition = EXCLUDED.coordinator_partition,
           producer_id = EXCLUDED.producer_id, producer_epoch = EXCLUDED.producer_epoch,
           timeout_ms = EXCLUDED.timeout_ms, state = EXCLUDED.state,
           started_at = CASE WHEN EXCLUDED.state <> 'Ongoing' THEN t.started_at
                             WHEN t.state = 'Ongoing' THEN t.started_at ELSE now() END,
           updated_at = now(), version = t.version + 1;
    IF p_state = 'Empty' THEN
        DELETE FROM transaction_partitions WHERE transactional_id = p_txn_id;
        -- offsets of an earlier instance never decided: that transaction is gone
        DELETE FROM txn_offsets WHERE transactional_id = p_txn_id AND decided IS NULL;
    END IF;
    INSERT INTO transaction_partitions (transactional_id, topic_id, partition)
    SELECT p_txn_id, a.topic_id, a.partition
      FROM unnest(p_add_topics, p_add_partitions) AS a(topic_id, partition)
      JOIN partitions AS p ON p.topic_id = a.topic_id AND p.partition = a.partition
    ON CONFLICT DO NOTHING;
    IF p_state IN ('PrepareCommit', 'PrepareAbort') THEN
        INSERT INTO txn_markers (topic_id, partition, producer_id, producer_epoch, commit,
                                 transactional_id, coordinator_epoch)
        SELECT tp.topic_id, tp.partition, p_producer_id, p_producer_epoch,
               p_state = 'PrepareCommit', p_txn_id, p_leader_epoch
          FROM transaction_partitions AS tp WHERE tp.transactional_id = p_txn_id
        ON CONFLICT (topic_id, partition, producer_id) DO UPDATE
           SET producer_epoch = EXCLUDED.producer_epoch, commit = EXCLUDED.commit,
               transactional_id = EXCLUDED.transactional_id,
               coordinator_epoch = EXCLUDED.coordinator_epoch;
        GET DIAGNOSTICS v_markers = ROW_COUNT;
        IF p_state = 'PrepareCommit' THEN
            INSERT INTO consumer_groups (group_id, coordinator_partition, written_by_node)
            SELECT DISTINCT o.group_id, o.coordinator_partition, p_node
              FROM txn_offsets AS o
             WHERE o.transactional_id = p_txn_id AND o.producer_id = p_producer_id
               AND o.decided IS NULL
            ON CONFLICT (group_id) DO NOTHING;
            INSERT INTO group_offsets AS g (group_id, topic, partition, committed_offset,
                                            leader_epoch, metadata)
            SELECT o.group_id, o.topic, o.partition, o.committed_offset, o.leader_epoch,
                   o.metadata
              FROM txn_offsets AS o
             WHERE o.transactional_id = p_txn_id AND o.producer_id = p_producer_id
               AND o.decided IS NULL
            ON CONFLICT (group_id, topic, partition) DO UPDATE
               SET committed_offset = EXCLUDED.committed_offset,
                   leader_epoch = EXCLUDED.leader_epoch, metadata = EXCLUDED.metadata,
                   committed_at = now();
        END IF;
        UPDATE txn_offsets
           SET decided = CASE WHEN p_state = 'PrepareCommit' THEN 'commit' ELSE 'abort' END
         WHERE transactional_id = p_txn_id AND producer_id = p_producer_id AND decided IS NULL;
        DELETE FROM transaction_partitions WHERE transactional_id = p_txn_id;
        IF v_markers = 0 THEN
            UPDATE transactions
               SET state = CASE p_state WHEN 'PrepareCommit' THEN 'CompleteCommit'
                                        ELSE 'CompleteAbort' END
             WHERE transactional_id = p_txn_id;
        ELSE
            PERFORM pg_notify('mink_txn_markers', '');
        END IF;
    END IF;
    RETURN 'ok';
END $$;

-- TxnOffsetCommit, on the group's coordinator (fenced by the group's partition of
-- __consumer_offsets): the offsets wait for the transaction's decision. 'ok',
-- 'not_coordinator', 'producer_fenced' (another epoch), 'invalid_txn_state' (the group is
-- not in an ongoing transaction of this producer).
CREATE FUNCTION mink_txn_offset_commit(p_topic_id uuid, p_partition integer,
                                       p_leader_epoch integer, p_node integer,
                                       p_node_epoch bigint, p_txn_id text,
                                       p_producer_id bigint, p_producer_epoch integer,
                                       p_group_id text, p_topics text[],
                                       p_partitions integer[], p_offsets bigint[],
                                       p_epochs integer[], p_metadata text[])
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    t transactions;
BEGIN
    IF NOT mink_check_group_coordinator(p_topic_id, p_partition, p_leader_epoch, p_node,
                                        p_node_epoch) THEN
        RETURN 'not_coordinator';
    END IF;
    SELECT * INTO t FROM transactions WHERE transactional_id = p_txn_id FOR SHARE;
    IF NOT FOUND OR t.producer_id <> p_producer_id THEN
        RETURN 'invalid_producer_id_mapping';
    END IF;
    IF t.producer_epoch <> p_producer_epoch THEN
        RETURN 'producer_fenced';
    END IF;
    IF t.state <> 'Ongoing' OR NOT EXISTS (
            SELECT 1 FROM transaction_partitions AS tp
             WHERE tp.transactional_id = p_txn_id AND tp.topic_id = p_topic_id
               AND tp.partition = p_partition) THEN
        RETURN 'invalid_txn_state';
    END IF;
    INSERT INTO txn_offsets AS o (producer_id, group_id, topic, partition, committed_offset,
                                  leader_epoch, metadata, coordinator_partition,
                                  transactional_id)
    SELECT p_producer_id, p_group_id, c.topic, c.partition, c.committed_offset,
           c.leader_epoch, c.metadata, p_partition, p_txn_id
      FROM unnest(p_topics, p_partitions, p_offsets, p_epochs, p_metadata)
           AS c(topic, partition, committed_offset, leader_epoch, metadata)
    ON CONFLICT (producer_id, group_id, topic, partition) DO UPDATE
       SET committed_offset = EXCLUDED.committed_offset, leader_epoch = EXCLUDED.leader_epoch,
           metadata = EXCLUDED.metadata, decided = NULL;
    RETURN 'ok';
END $$;

-- The marker of a group's partition of __consumer_offsets, taken by that partition's leader
-- (the group coordinator): the decided offsets of the producer go, and are returned
-- ([[group, topic, partition, offset, leader epoch, metadata, committed], ...]) for its cache.
-- NULL: not the coordinator.
CREATE FUNCTION mink_txn_group_marker(p_topic_id uuid, p_partition integer,
                                      p_leader_epoch integer, p_node integer,
                                      p_node_epoch bigint, p_producer_id bigint)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_done jsonb;
BEGIN
    IF NOT mink_check_group_coordinator(p_topic_id, p_partition, p_leader_epoch, p_node,
                                        p_node_epoch) THEN
        RETURN NULL;
    END IF;
    WITH gone AS (
        DELETE FROM txn_offsets AS o
         WHERE o.producer_id = p_producer_id AND o.coordinator_partition = p_partition
           AND o.decided IS NOT NULL
        RETURNING o.*
    )
    SELECT coalesce(jsonb_agg(jsonb_build_array(group_id, topic, partition, committed_offset,
                                                leader_epoch, metadata, decided = 'commit')),
                    '[]'::jsonb)
      INTO v_done FROM gone;
    PERFORM mink_txn_marker_done(p_topic_id, p_partition, p_producer_id);
    RETURN v_done;
END $$;

-- A big-endian signed integer of `p_len` bytes at `p_from` (1-based) of a bytea.
CREATE FUNCTION mink_be_int(p_data bytea, p_from integer, p_len integer) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE p_len
        WHEN 4 THEN ('x' || encode(substring(p_data FROM p_from FOR 4), 'hex'))::bit(32)::integer::bigint
        ELSE ('x' || encode(substring(p_data FROM p_from FOR 8), 'hex'))::bit(64)::bigint END;
$$;

-- The transactional header of a producer state (mink/storage/producer_state.py,
-- encode_entry): b'MKT1', flags (1 byte; 1 = the producer's last append was a marker not yet
-- known durable), the ongoing transaction's first offset (8), n (4), n x (first offset,
-- marker offset) of aborts not yet known durable, then the msgpack state. Written by
-- mink_commit_wal in the WAL commit's transaction, so what it says is durable with the data.
CREATE FUNCTION mink_producer_state_txn() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_flags integer;
    v_count integer;
    i       integer;
BEGIN
    IF length(NEW.state) < 17 OR substring(NEW.state FROM 1 FOR 4) <> '\x4d4b5431'::bytea THEN
        RETURN NULL;
    END IF;
    v_flags := get_byte(NEW.state, 4);
    v_count := mink_be_int(NEW.state, 14, 4)::integer;
    FOR i IN 0 .. v_count - 1 LOOP
        INSERT INTO aborted_transactions (topic_id, partition, producer_id, first_offset,
                                          last_offset)
        VALUES (NEW.topic_id, NEW.partition, NEW.producer_id,
                mink_be_int(NEW.state, 18 + 16 * i, 8), mink_be_int(NEW.state, 26 + 16 * i, 8))
        ON CONFLICT DO NOTHING;
    END LOOP;
    IF v_flags & 1 = 1 THEN
        PERFORM mink_txn_marker_done(NEW.topic_id, NEW.partition, NEW.producer_id);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER producer_state_txn AFTER INSERT OR UPDATE OF state ON producer_state
    FOR EACH ROW EXECUTE FUNCTION mink_producer_state_txn();

-- A node that is not the cluster coordinator asks it for __transaction_state this way.
ALTER TABLE cluster_requests DROP CONSTRAINT cluster_requests_kind_check;
ALTER TABLE cluster_requests ADD CONSTRAINT cluster_requests_kind_check
    CHECK (kind IN ('rebalance', 'transaction_state'));

-- The aborted-transaction index stays proportional to retained data: aborts wholly below a
-- partition's new log start (retention, DeleteRecords) go with it.
CREATE FUNCTION mink_prune_aborted_transactions() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM aborted_transactions
     WHERE topic_id = NEW.topic_id AND partition = NEW.partition
       AND last_offset < NEW.log_start_offset;
    RETURN NULL;
END $$;

CREATE TRIGGER partitions_prune_aborted_transactions
    AFTER UPDATE OF log_start_offset ON partitions
    FOR EACH ROW WHEN (NEW.log_start_offset > OLD.log_start_offset)
    EXECUTE FUNCTION mink_prune_aborted_transactions();
