-- Sent ahead of a claim on a direct connection (every claim of a plain
-- table; on a partitioned one, the unordered claims), in the same
-- round trip as the claim and its COMMIT: the claim runs on the plan made
-- for it once per connection instead of being planned for its parameters
-- (0.35 ms a batch, most of what the relay's statement cost PostgreSQL
-- beyond the row-lock loop's; docs/performance.md, "Generic plans for the
-- claim"). LOCAL, so every other statement keeps the session's custom
-- plans. A worker that records its confirmed rows on its own (an ordered
-- relay, every batch) sends the recording the same way: it is the
-- statement that unordered claims run inside them.
--
-- A generic plan is costed once, for the table as it is then, often
-- empty. The claim statements are written so that each of their scans has
-- one sensible path (tests/claim_paths.rs plans them on an empty table and
-- reads the plans kept on a full one), and these settings take away the
-- rest: no sequential scans or merge joins, which an empty table makes
-- look cheapest. The statements join the table to nothing (they find its
-- rows by index conditions, lateral probes and subqueries that stay
-- subplans), so the only joins left are of their own intermediate
-- results, at most a batch each (claim_lease.sql): a hash joins those in
-- one pass, where a nested loop, which a plan made on an analyzed empty
-- table chose, compared every pair (0.3 ms of a claim of 100 rows). So
-- nested loops are off too; an ordered claim's lateral probes are nested
-- loops all the same, as there is no other way to run them. jit is off
-- because a plan that still needs a disabled
-- node carries the planner's disable cost into its estimate, which then
-- passes jit_above_cost: compiling cost half a second on every claim.
-- enable_bitmapscan is already off for the session (relay_settings.sql).
BEGIN;
SET LOCAL plan_cache_mode = force_generic_plan;
SET LOCAL jit = off;
SET LOCAL enable_seqscan = off;
SET LOCAL enable_mergejoin = off;
SET LOCAL enable_nestloop = off
