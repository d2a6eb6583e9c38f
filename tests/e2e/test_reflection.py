"""Acceptance 9: server reflection lists the services on the router and on every pod; health is SERVING."""

from __future__ import annotations

import grpc
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from cli.cluster import LocalCluster

STANDARD = {"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection", "grpc.reflection.v1.ServerReflection"}
OWN_SERVICE = {
    "router": "pdserve.v1.GenerationService",
    "prefill": "pdserve.v1.PrefillService",
    "decode": "pdserve.v1.DecodeService",
}


def check_server(address: str, own_service: str) -> None:
    with grpc.insecure_channel(address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        assert set(database.get_services()) == {own_service, *STANDARD}
        service = DescriptorPool(database).FindServiceByName(own_service)
        assert service.methods, f"{own_service} on {address} has no methods"
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        for name in ("", own_service):
            response = check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert response.status == health_pb2.HealthCheckResponse.SERVING, (address, name)


def test_reflection_and_health_on_the_router_and_every_pod(cluster: LocalCluster) -> None:
    check_server(cluster.router_address, OWN_SERVICE["router"])
    pods = cluster.pod_infos()
    assert sorted(pod.pod_id for pod in pods) == sorted(cluster.pod_ids)
    for pod in pods:
        check_server(pod.address, OWN_SERVICE[pod.role])


def test_generation_service_methods_are_described_by_reflection(cluster: LocalCluster) -> None:
    with grpc.insecure_channel(cluster.router_address) as channel:
        pool = DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
        service = pool.FindServiceByName(OWN_SERVICE["router"])
        assert {m.name for m in service.methods} == {
            "Generate",
            "GetModelInfo",
            "Tokenize",
            "Abort",
            "GetServerInfo",
            "GetLoad",
        }
        generate = service.methods_by_name["Generate"]
        assert generate.server_streaming and not generate.client_streaming
        assert "metrics" in generate.output_type.fields_by_name
