"""Trace record and replay of allocator and prefix-cache operations (JSON lines, optionally gzip).

A trace lets another backend be driven with exactly the operations swajax saw, and checked
against swajax's results. Line 1 is `{"op": "init", ...}` (format version, model config, pool
sizes, page size, mode, window, leaf cap, cache policy profile, the number of operation lines,
and `ran`: overlap scheduling and speculative decoding, as they ran), the last
`{"op": "end", "ops": n}`; `check.py` holds the schema every line is checked against before
replay, `codec.py` the delta encoding that keeps a trace's size linear in the tokens
processed. Every other line is one operation with its arguments and an
`expect` object:

  alloc_extend  prefix_lens, seq_lens, last_loc     -> status, slots
  alloc_decode  seq_lens, last_loc                   -> status, slots
  free / free_swa  slots                             -> available, mapped (hybrid: slots of
                                                        the freed pages still mapped, 0)
  match         tokens                               -> length, slots, tail_miss
  insert        tokens, slots, prev_prefix_len, swa_evicted_seqlen -> prefix_len
  lock          node (tokens from the root to the node's end) -> handle
  unlock / release_swa  handle
  evict         full, swa                            -> evicted
  cache_finished    tokens, slots, cache_protected_len, swa_evicted_seqlen, handle, insert
                    [, swa_evict_floor: the prefill-floor rule's, all-SWA pools]
                    [, swa_branching_seqlen: the branch-insert rule's branch point]
  cache_unfinished  tokens, slots, cache_protected_len, swa_evicted_seqlen, handle
                    [, swa_branching_seqlen]
                                                     -> prefix, handle

Every `expect` also carries `available` ([full, SWA] free tokens after the operation) and the
cache's evictable / protected sizes. Handles are numbered in the order locks are taken. Only
outermost calls are recorded: what the cache does inside `insert` is replayed by `insert`.
An allocation is recorded where its step was launched (with overlap scheduling, before the host
took the previous step's result), so the lines are in the order the device saw them.
"""
