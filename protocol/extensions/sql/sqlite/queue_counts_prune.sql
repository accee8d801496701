-- Forget the counters of width :width_s whose period began before :cutoff_ms (older
-- than any chart of that width shows).
delete from cairnqd_queue_counts
where width_s = :width_s and start_ms < :cutoff_ms
