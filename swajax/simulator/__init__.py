"""The simulator: the null-model engine driven through a workload (`run`), the workloads
themselves, a roofline clock per step (`step_time`) and the ratio planner built on both."""
