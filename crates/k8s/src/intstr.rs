//! IntOrString values that scale against a total (upstream's
//! `intstr.GetScaledValueFromIntOrPercent`): `maxUnavailable`, `minAvailable`, `maxSurge`.

use serde_json::Value;

/// The value of `v` against `total`: an integer as is, `"N%"` as N percent of `total`,
/// rounded up or down. Upstream's error texts for anything else.
pub fn scaled_value(v: &Value, total: i64, round_up: bool) -> Result<i64, String> {
    match v {
        Value::Number(n) => n
            .as_i64()
            .ok_or_else(|| format!("invalid value for IntOrString: {n}")),
        Value::String(s) => {
            let Some(digits) = s.strip_suffix('%') else {
                return Err(
                    "invalid value for IntOrString: invalid type: string is not a percentage"
                        .into(),
                );
            };
            let pct = digits.parse::<i64>().map_err(|_| {
                format!(
                    "invalid value for IntOrString: invalid value {s:?}: strconv.Atoi: parsing {digits:?}: invalid syntax"
                )
            })?;
            let scaled = pct * total;
            Ok(if round_up {
                (scaled + 99).div_euclid(100)
            } else {
                scaled.div_euclid(100)
            })
        }
        _ => Err("invalid value for IntOrString: invalid type: neither int nor percentage".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn integers_and_percentages_scale_as_upstream() {
        for (v, total, up, want) in [
            (json!(3), 10, true, Ok(3)),
            (json!("50%"), 3, true, Ok(2)),
            (json!("50%"), 3, false, Ok(1)),
            (json!("100%"), 7, true, Ok(7)),
            (json!("0%"), 7, true, Ok(0)),
            (json!("25%"), 0, true, Ok(0)),
            (json!("10%"), 1, true, Ok(1)),
        ] {
            assert_eq!(scaled_value(&v, total, up), want, "{v} of {total}");
        }
        assert!(scaled_value(&json!("half"), 4, true).is_err());
        assert!(scaled_value(&json!(null), 4, true).is_err());
    }
}
