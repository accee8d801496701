-- Claims are ordered priority desc, run_at_ms asc, id asc from here on. Ordering by
-- run_at_ms lets a draw stop at the first row that is not yet due instead of walking
-- every backing-off row created earlier. With id in the key, ties are deterministic and
-- the order reads straight off the index (no sort node under the LIMIT).
--
-- Both indexes are rebuilt under their old names. The create has no "if not exists":
-- after the drop, the old definition must never survive. The rebuild blocks writers,
-- which is why the ledger records it and it is not replayed needlessly.
drop index if exists cairnq_tasks_claim_idx;
drop index if exists cairnq_tasks_claim_name_idx;

create index cairnq_tasks_claim_idx
    on cairnq_tasks (queue, status, priority desc, run_at_ms, id);
create index cairnq_tasks_claim_name_idx
    on cairnq_tasks (queue, status, name, priority desc, run_at_ms, id);

update cairnq_meta set value = '8' where key = 'schema_version';
