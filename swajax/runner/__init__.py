"""The device half of a step: `commit_step` (memory and attention metadata in one jitted call),
input packing, and `DeviceRunner` (one upload, one program, one read per step); `HostRunner`,
the same contract for a model that reads no KV (the null model), with no device program. It
sits above `serving`, whose `Runner` contract they fulfil; engines receive one from whoever
builds them."""

from swajax.runner.device_runner import DeviceRunner as DeviceRunner
from swajax.runner.host_runner import HostRunner as HostRunner
