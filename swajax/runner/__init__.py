"""The device half of a step: `commit_step` (memory and attention metadata in one jitted call),
input packing, and `DeviceRunner` (one upload, one program, one read per step). It sits above
`serving`, whose `Runner` contract it fulfils; engines receive it from whoever builds them."""

from swajax.runner.device_runner import DeviceRunner as DeviceRunner
