"""Test harnesses: LocalCluster (real processes), the etcd runner, fakes."""
