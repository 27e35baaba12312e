"""Discovers the registry's gRPC API with the official Python reflection
client (grpcio-reflection, which speaks grpc.reflection.v1alpha only).

Usage: reflection_client.py HOST:PORT
Prints one JSON object: the listed services, the methods of
quiver.registry.v1.McpRegistryService and the field count of its
ListMcpServersRequest, all resolved through reflection.
"""

import json
import sys

import grpc
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

SERVICE = "quiver.registry.v1.McpRegistryService"

with grpc.insecure_channel(sys.argv[1]) as channel:
    database = ProtoReflectionDescriptorDatabase(channel)
    services = list(database.get_services())
    pool = DescriptorPool(database)
    service = pool.FindServiceByName(SERVICE)
    methods = [method.name for method in service.methods]
    request = pool.FindMessageTypeByName("quiver.registry.v1.ListMcpServersRequest")
    print(
        json.dumps(
            {
                "services": services,
                "methods": methods,
                "list_request_fields": len(request.fields),
            }
        )
    )
