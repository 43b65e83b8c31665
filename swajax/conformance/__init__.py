"""A conformance kit: golden cases in language-neutral files, and a runner that drives another
backend (an `Adapter`) through them. `swajax conformance export DIR` / `run --adapter M:C DIR`.

Case kinds: operation sequences (trace format 3, JSON lines with expected results), paged
attention (`.npz`: pools with NaN in every unused, freed and dummy slot, page tables, window
kind, sinks, soft cap, float64 expected output) and model logits (a checkpoint folder, a prompt
and the expected logits). See README "Conformance kit" for the adapter protocol.
"""
