"""What AWS ParallelCluster 3 tags its instances with (pcluster.constants PCLUSTER_NODE_TYPE_TAG,
PCLUSTER_QUEUE_NAME_TAG; pcluster.models.cluster.NodeType): how its nodes are found (the discovery entry's
`node_tags`, read by fmcluster.nodes on the deploy machine and the nodes) and how the local stand-in tags its own."""

from __future__ import annotations

from fmcluster.nodes import NodeTags

NODE_TAGS = NodeTags("parallelcluster:node-type", {"HeadNode": "controller", "LoginNode": "login", "Compute": "compute"},
                     "parallelcluster:queue-name")
