"""The two messages of the standard `grpc.health.v1` Check call, built at import time in a
private descriptor pool: the SDK needs no grpcio-health-checking, and a private pool cannot
clash with that package's definitions when both are loaded."""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

CHECK_METHOD = "/grpc.health.v1.Health/Check"
STATUSES = ("UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN")


def _build():
    F = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="specray/client/health_check.proto",
                                              package="grpc.health.v1", syntax="proto3")
    request = file.message_type.add(name="HealthCheckRequest")
    request.field.add(name="service", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    response = file.message_type.add(name="HealthCheckResponse")
    status = response.enum_type.add(name="ServingStatus")
    for number, name in enumerate(STATUSES):
        status.value.add(name=name, number=number)
    response.field.add(name="status", number=1, type=F.TYPE_ENUM, label=F.LABEL_OPTIONAL,
                       type_name=".grpc.health.v1.HealthCheckResponse.ServingStatus")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return tuple(message_factory.GetMessageClass(pool.FindMessageTypeByName(f"grpc.health.v1.{name}"))
                 for name in ("HealthCheckRequest", "HealthCheckResponse"))


HealthCheckRequest, HealthCheckResponse = _build()


def status_name(response) -> str:
    return STATUSES[response.status] if 0 <= response.status < len(STATUSES) else "UNKNOWN"
