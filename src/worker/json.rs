//! Exact conversion between Rhai values and JSON. A value that JSON cannot
//! hold faithfully (function pointers, NaN, timestamps, …) is an error with
//! the Rhai type name, so it is reported as dropped rather than mangled.

use rhai::{Array, Dynamic, Map as RhaiMap};
use serde_json::{Map, Number, Value};

/// Rhai → JSON.
pub(crate) fn to_json(d: &Dynamic, depth: usize) -> Result<Value, String> {
    if depth > 128 {
        return Err("nested too deeply".into());
    }
    if d.is_unit() {
        return Ok(Value::Null);
    }
    if let Ok(b) = d.as_bool() {
        return Ok(Value::Bool(b));
    }
    if let Ok(i) = d.as_int() {
        return Ok(Value::Number(i.into()));
    }
    if let Ok(f) = d.as_float() {
        return Number::from_f64(f)
            .map(Value::Number)
            .ok_or_else(|| format!("float {f} has no JSON form"));
    }
    if let Ok(c) = d.as_char() {
        return Ok(Value::String(c.to_string()));
    }
    if d.is_string() {
        return Ok(Value::String(d.to_string()));
    }
    if d.is_array() {
        let arr = d
            .read_lock::<Array>()
            .ok_or_else(|| "array is locked".to_string())?;
        return arr
            .iter()
            .map(|x| to_json(x, depth + 1))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array);
    }
    if d.is_map() {
        let map = d
            .read_lock::<RhaiMap>()
            .ok_or_else(|| "map is locked".to_string())?;
        let mut out = Map::new();
        for (k, v) in map.iter() {
            out.insert(k.to_string(), to_json(v, depth + 1)?);
        }
        return Ok(Value::Object(out));
    }
    if d.is_blob() {
        let blob = d
            .read_lock::<rhai::Blob>()
            .ok_or_else(|| "blob is locked".to_string())?;
        return Ok(Value::Array(
            blob.iter().map(|b| Value::Number((*b).into())).collect(),
        ));
    }
    Err(format!(
        "a value of type {} has no JSON form",
        d.type_name()
    ))
}

/// JSON → Rhai.
pub(crate) fn from_json(v: &Value) -> Dynamic {
    match v {
        Value::Null => Dynamic::UNIT,
        Value::Bool(b) => Dynamic::from_bool(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Dynamic::from_int(i),
            None => Dynamic::from_float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => Dynamic::from(s.clone()),
        Value::Array(a) => Dynamic::from_array(a.iter().map(from_json).collect()),
        Value::Object(o) => {
            let mut m = RhaiMap::new();
            for (k, v) in o {
                m.insert(k.as_str().into(), from_json(v));
            }
            Dynamic::from_map(m)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trips() {
        let v = json!({"a": [1, 2.5, "x", null, true], "b": {"c": -3}});
        assert_eq!(to_json(&from_json(&v), 0).unwrap(), v);
    }

    #[test]
    fn refuses_what_json_cannot_hold() {
        assert!(to_json(&Dynamic::from_float(f64::NAN), 0).is_err());
        let fp = Dynamic::from(rhai::FnPtr::new("f").unwrap());
        assert!(to_json(&fp, 0).unwrap_err().contains("Fn"));
    }
}
