"""The model toolkit every tool on a host builds on: the model as pieces (`model`, `pieces`), split points
and stage-local building (`partition`, `stage`), artifacts (`artifact`, `kept_pair`), numerics, the wire's
codec, what a pass measures (`measure`, `outputs`) and how a schedule takes its inputs (`schedule_inputs`).
The inference pipeline (`remote.runtime`), training, pruning and profiling import it; it imports none of
them."""
