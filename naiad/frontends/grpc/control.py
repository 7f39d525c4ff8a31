"""Every GRPCInferenceService RPC except inference: health, metadata, config, statistics, repository,
shared memory, trace and log settings. Control plane: clarity over speed, answers as Triton 2.51 gives them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb

from naiad.core.errors import invalid
from naiad.core.settings import LOG_KEYS, log_changes, no_file_change, trace_changes
from naiad.frontends.grpc.codec import parse_version
from naiad.service import CodeConsent, Face, decode_files


class Control:
    def __init__(self, service: Face, consent: CodeConsent | None = None) -> None:
        self.service = service
        # May a load carry code (consent.py)? Only when model-repository is restricted here, or the operator says so.
        self.consent = consent or CodeConsent(False, "--grpc-restricted-protocol")

    # --- health and metadata ------------------------------------------------------------------------------------

    def ServerLive(self, request: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.service.live)

    def ServerReady(self, request: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.service.is_ready())

    def ModelReady(self, request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        version = parse_version(request.version)
        return pb.ModelReadyResponse(ready=self.service.model_ready(request.name, version))

    def ServerMetadata(self, request: pb.ServerMetadataRequest) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(**self.service.server_metadata())

    async def ModelMetadata(self, request: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        meta = await self.service.model_metadata(request.name, parse_version(request.version))
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=meta["name"], versions=meta["versions"], platform=meta["platform"],
            inputs=[tensor(**t) for t in meta["inputs"]], outputs=[tensor(**t) for t in meta["outputs"]],
        )

    async def ModelConfig(self, request: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        # The very message the HTTP /config JSON is rendered from.
        return pb.ModelConfigResponse(config=await self.service.model_config_message(
            request.name, parse_version(request.version)))

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest) -> pb.ModelStatisticsResponse:
        stats = await self.service.model_statistics(request.name, parse_version(request.version))
        # Triton's statistics JSON uses the protobuf field names, so the library maps it field for field.
        return json_format.ParseDict(stats, pb.ModelStatisticsResponse())

    # --- repository ---------------------------------------------------------------------------------------------

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest) -> pb.RepositoryIndexResponse:
        rows = await self.service.repository_index(request.ready)
        return pb.RepositoryIndexResponse(models=[pb.RepositoryIndexResponse.ModelIndex(**row) for row in rows])

    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest) -> pb.RepositoryModelLoadResponse:
        params = request.parameters
        config = params["config"].string_param if "config" in params else None
        await self.service.load_model(request.model_name, config, decode_files(
            {k: p.bytes_param for k, p in params.items() if k.startswith("file:")}, base64_encoded=False), self.consent)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest
                                    ) -> pb.RepositoryModelUnloadResponse:
        params = request.parameters
        dependents = params["unload_dependents"].bool_param if "unload_dependents" in params else False
        await self.service.unload_model(request.model_name, dependents)
        return pb.RepositoryModelUnloadResponse()

    # --- shared memory -------------------------------------------------------------------------------------------

    async def SystemSharedMemoryStatus(self, request: pb.SystemSharedMemoryStatusRequest
                                       ) -> pb.SystemSharedMemoryStatusResponse:
        status = pb.SystemSharedMemoryStatusResponse.RegionStatus
        return pb.SystemSharedMemoryStatusResponse(regions={
            region["name"]: status(**region) for region in await self.service.shm_status(request.name)})

    async def SystemSharedMemoryRegister(self, request: pb.SystemSharedMemoryRegisterRequest
                                         ) -> pb.SystemSharedMemoryRegisterResponse:
        await self.service.shm_register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request: pb.SystemSharedMemoryUnregisterRequest
                                           ) -> pb.SystemSharedMemoryUnregisterResponse:
        if request.name:
            await self.service.shm_unregister(request.name)
        else:
            await self.service.shm_unregister_all()
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(self, request: pb.CudaSharedMemoryStatusRequest
                                     ) -> pb.CudaSharedMemoryStatusResponse:
        await self.service.shm_cuda_status(request.name)  # no CUDA region can exist: only errors to give
        return pb.CudaSharedMemoryStatusResponse()

    async def CudaSharedMemoryRegister(self, request: pb.CudaSharedMemoryRegisterRequest
                                       ) -> pb.CudaSharedMemoryRegisterResponse:
        await self.service.shm_cuda_register(request.name)
        return pb.CudaSharedMemoryRegisterResponse()

    def CudaSharedMemoryUnregister(self, request: pb.CudaSharedMemoryUnregisterRequest
                                   ) -> pb.CudaSharedMemoryUnregisterResponse:
        return pb.CudaSharedMemoryUnregisterResponse()  # no CUDA region can exist: nothing to release

    # --- trace and log settings ------------------------------------------------------------------------------------

    async def TraceSetting(self, request: pb.TraceSettingRequest) -> pb.TraceSettingResponse:
        model = request.model_name
        if model and not self.service.model_ready(model):
            raise invalid(f"Request for unknown model : {model}")
        if request.settings:
            # An empty value list clears a setting.
            values = {key: list(setting.value) or None for key, setting in request.settings.items()}
            await self.service.update_trace_settings(model, trace_changes(values))
        value = pb.TraceSettingResponse.SettingValue
        return pb.TraceSettingResponse(settings={k: value(value=v)
                                                 for k, v in (await self.service.trace_settings(model)).items()})

    async def LogSettings(self, request: pb.LogSettingsRequest) -> pb.LogSettingsResponse:
        if request.settings:
            await self.service.update_log_settings(log_changes(_log_values(request.settings)))
        value = pb.LogSettingsResponse.SettingValue
        settings: dict[str, Any] = {}
        for key, current in (await self.service.log_settings_values()).items():
            if isinstance(current, bool):
                settings[key] = value(bool_param=current)
            elif isinstance(current, int):
                settings[key] = value(uint32_param=current)
            else:
                settings[key] = value(string_param=current)
        return pb.LogSettingsResponse(settings=settings)


# The parameter a log setting must arrive in, and how Triton names that type in its error.
_LOG_PARAMS = {bool: ("bool_param", "boolean"), int: ("uint32_param", "int32"), str: ("string_param", "string")}


def _log_values(settings: Any) -> dict[str, Any]:
    if "log_file" in settings:
        raise no_file_change("log_file")
    values: dict[str, Any] = {}
    for key, (_, kind) in LOG_KEYS.items():
        if key not in settings:
            continue
        param, kind_name = _LOG_PARAMS[kind]
        if settings[key].WhichOneof("parameter_choice") != param:
            raise invalid(f"expect {kind_name} for '{key}'")
        values[key] = getattr(settings[key], param)
    return values


def unary_methods(control: Control) -> dict[str, Callable[[Any], Any]]:
    """RPC name -> its plain handler, for the server to wrap."""
    return {name: getattr(control, name) for name in (
        "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelConfig",
        "ModelStatistics", "RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload",
        "SystemSharedMemoryStatus", "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister",
        "CudaSharedMemoryStatus", "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister", "TraceSetting",
        "LogSettings",
    )}
