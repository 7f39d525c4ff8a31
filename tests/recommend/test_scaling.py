"""The winner's SageMakerVariantInvocationsPerInstance target as Application Auto Scaling's put_scaling_policy
request, checked against botocore's own model of that call (its parameter validator, and the enums it lists)."""

from __future__ import annotations

import botocore.session
import pytest
from botocore.validate import validate_parameters

from naiad.recommend.scaling import SAFETY_FACTOR, describe, policy_for
from naiad.recommend.select import Row


def _operation():  # noqa: ANN202 - botocore's OperationModel
    model = botocore.session.get_session().get_service_model("application-autoscaling")
    return model.operation_model("PutScalingPolicy")


def _row(sla: float | None, top: float | None = 6000.0) -> Row:
    return Row("onnxruntime: dynamic batching", "onnxruntime", "dynamic batching", "db", "measured",
               max_invocations_per_minute=top, sla_invocations_per_minute=sla)


@pytest.mark.parametrize(("sla", "measured"), [(4200.0, 4200.0), (None, 6000.0)])
def test_the_policy_is_a_valid_put_scaling_policy_request(sla: float | None, measured: float) -> None:
    document = policy_for(_row(sla), "arith")
    assert document is not None
    operation = _operation()
    validate_parameters(document, operation.input_shape)  # raises ParamValidationError on any wrong field
    members = operation.input_shape.members
    assert document["ServiceNamespace"] in members["ServiceNamespace"].enum
    assert document["ScalableDimension"] in members["ScalableDimension"].enum
    assert document["PolicyType"] in members["PolicyType"].enum
    tracking = members["TargetTrackingScalingPolicyConfiguration"].members
    metric = tracking["PredefinedMetricSpecification"].members["PredefinedMetricType"]
    config = document["TargetTrackingScalingPolicyConfiguration"]
    assert config["PredefinedMetricSpecification"]["PredefinedMetricType"] in metric.enum
    assert config["PredefinedMetricSpecification"]["PredefinedMetricType"] == "SageMakerVariantInvocationsPerInstance"
    assert config["TargetValue"] == measured * SAFETY_FACTOR
    assert document["ResourceId"] == "endpoint/arith/variant/AllTraffic"
    assert f"safety factor {SAFETY_FACTOR:g}" in describe(_row(sla))
    assert ("within the SLA" in describe(_row(sla))) == (sla is not None)


def test_a_wrong_field_fails_the_same_check() -> None:
    """The check can fail: botocore refuses a misspelt member and a missing required one."""
    from botocore.exceptions import ParamValidationError

    document = policy_for(_row(None), "arith")
    assert document is not None
    with pytest.raises(ParamValidationError):
        validate_parameters({**document, "PolicyKind": "x"}, _operation().input_shape)
    with pytest.raises(ParamValidationError):
        validate_parameters({k: v for k, v in document.items() if k != "ResourceId"}, _operation().input_shape)


def test_no_throughput_no_policy() -> None:
    assert policy_for(_row(None, top=None), "arith") is None
