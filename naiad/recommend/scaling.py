"""What the measurements tell an operator to scale on: the winner's ``SageMakerVariantInvocationsPerInstance``
target as Application Auto Scaling's ``put_scaling_policy`` request (target tracking on the endpoint variant's
instance count), ready for ``aws application-autoscaling put-scaling-policy --cli-input-json file://...`` or
boto3's ``put_scaling_policy(**document)``.

The target is invocations per instance per minute: what one instance served within the SLA (else at its
throughput's ceiling), times a safety factor. SageMaker's guidance for this metric is 0.5: it leaves room for
the minutes a scale-out takes and for traffic that is burstier than the test's steps.
"""

from __future__ import annotations

from typing import Any

from naiad.recommend.select import Row

SAFETY_FACTOR = 0.5
METRIC = "SageMakerVariantInvocationsPerInstance"
VARIANT = "AllTraffic"  # SageMaker's default production variant name
SCALE_IN_COOLDOWN_S = 300  # scale in slowly: an instance removed too early is a latency spike
SCALE_OUT_COOLDOWN_S = 60


def measured(row: Row) -> tuple[float | None, str]:
    """Invocations per minute one instance sustained, and where: within the SLA when one was given."""
    if row.sla_invocations_per_minute:
        return row.sla_invocations_per_minute, "within the SLA"
    return row.max_invocations_per_minute, "at the highest throughput (no SLA given)"


def policy_for(row: Row, endpoint: str, variant: str = VARIANT) -> dict[str, Any] | None:
    """The put_scaling_policy request for ``endpoint``'s ``variant``; None when the row has no throughput."""
    per_minute, _ = measured(row)
    if not per_minute:
        return None
    return {
        "PolicyName": f"{endpoint}-invocations-per-instance",
        "ServiceNamespace": "sagemaker",
        "ResourceId": f"endpoint/{endpoint}/variant/{variant}",
        "ScalableDimension": "sagemaker:variant:DesiredInstanceCount",
        "PolicyType": "TargetTrackingScaling",
        "TargetTrackingScalingPolicyConfiguration": {
            "TargetValue": round(per_minute * SAFETY_FACTOR, 1),
            "PredefinedMetricSpecification": {"PredefinedMetricType": METRIC},
            "ScaleInCooldown": SCALE_IN_COOLDOWN_S,
            "ScaleOutCooldown": SCALE_OUT_COOLDOWN_S,
        },
    }


def describe(row: Row) -> str:
    per_minute, where = measured(row)
    return (f"target {METRIC} {(per_minute or 0) * SAFETY_FACTOR:.0f}: {per_minute or 0:.0f} invocations/min per "
            f"instance {where} x safety factor {SAFETY_FACTOR:g}; the endpoint name in ResourceId is the model's: "
            "set yours, and register the scalable target (register_scalable_target) first")
