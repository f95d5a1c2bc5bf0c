"""MAD formats: field tables of the management classes, headers, RMPP and TIDs, dumps.

Nothing here touches the access layer: providers (the mock's SMA/PMA/SA agents,
rdma_core's port watch) and the MAD services above the access layer share them.
"""
