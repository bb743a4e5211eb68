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

/// Whether `to_json(d)` would be `v`, found without building it (and
/// without copying what `d` holds).
pub(crate) fn same(d: &Dynamic, v: &Value, depth: usize) -> bool {
    if depth > 128 {
        return false;
    }
    if d.is_unit() {
        return v.is_null();
    }
    if let Ok(b) = d.as_bool() {
        return v.as_bool() == Some(b);
    }
    if let Ok(i) = d.as_int() {
        return matches!(v, Value::Number(n) if *n == Number::from(i));
    }
    if let Ok(f) = d.as_float() {
        return matches!((v, Number::from_f64(f)), (Value::Number(n), Some(m)) if *n == m);
    }
    if let Ok(c) = d.as_char() {
        let mut buf = [0u8; 4];
        return v.as_str() == Some(c.encode_utf8(&mut buf));
    }
    if d.is_string() {
        return match (d.as_immutable_string_ref(), v.as_str()) {
            (Ok(s), Some(t)) => s.as_str() == t,
            _ => false,
        };
    }
    if d.is_array() {
        let (Some(arr), Some(items)) = (d.read_lock::<Array>(), v.as_array()) else {
            return false;
        };
        return arr.len() == items.len()
            && arr.iter().zip(items).all(|(x, y)| same(x, y, depth + 1));
    }
    if d.is_map() {
        let (Some(map), Some(obj)) = (d.read_lock::<RhaiMap>(), v.as_object()) else {
            return false;
        };
        return map.len() == obj.len()
            && map
                .iter()
                .all(|(k, x)| obj.get(k.as_str()).is_some_and(|y| same(x, y, depth + 1)));
    }
    if d.is_blob() {
        let (Some(blob), Some(items)) = (d.read_lock::<rhai::Blob>(), v.as_array()) else {
            return false;
        };
        return blob.len() == items.len()
            && blob
                .iter()
                .zip(items)
                .all(|(b, y)| matches!(y, Value::Number(n) if *n == Number::from(*b)));
    }
    false
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

    /// `same` says what comparing `to_json`'s value would, for values of
    /// every kind, against equal and unequal JSON.
    #[test]
    fn same_agrees_with_to_json() {
        let mut map = RhaiMap::new();
        map.insert("k".into(), Dynamic::from_int(1));
        map.insert("s".into(), Dynamic::from("x".to_string()));
        let values = vec![
            Dynamic::UNIT,
            Dynamic::from_bool(true),
            Dynamic::from_int(-3),
            Dynamic::from_int(7),
            Dynamic::from_float(1.0),
            Dynamic::from_float(2.5),
            Dynamic::from_float(f64::NAN),
            Dynamic::from_char('é'),
            Dynamic::from("é".to_string()),
            Dynamic::from("".to_string()),
            Dynamic::from_array(vec![Dynamic::from_int(1), Dynamic::from("a".to_string())]),
            Dynamic::from_array(vec![]),
            Dynamic::from_map(map),
            Dynamic::from_map(RhaiMap::new()),
            Dynamic::from_blob(vec![0, 255]),
            Dynamic::from(rhai::FnPtr::new("f").unwrap()),
        ];
        let jsons = [
            json!(null),
            json!(true),
            json!(false),
            json!(-3),
            json!(7),
            json!(7.0),
            json!(1.0),
            json!(1),
            json!(2.5),
            json!("é"),
            json!(""),
            json!("x"),
            json!([1, "a"]),
            json!(["a", 1]),
            json!([1]),
            json!([]),
            json!({"k": 1, "s": "x"}),
            json!({"s": "x", "k": 1}),
            json!({"k": 1}),
            json!({"k": 1, "s": "y"}),
            json!({"k": 1, "t": "x"}),
            json!({}),
            json!([0, 255]),
            json!([0, 254]),
            json!(18446744073709551615u64),
        ];
        let mut agreed = 0;
        for d in &values {
            for v in &jsons {
                let expected = to_json(d, 0).is_ok_and(|j| &j == v);
                assert_eq!(same(d, v, 0), expected, "{d:?} against {v}");
                agreed += usize::from(expected);
            }
        }
        // Each value equal to some JSON above (but the two with no JSON
        // form), two maps in either key order, 1.0 as float only.
        assert_eq!(agreed, 15);
    }

    #[test]
    fn refuses_what_json_cannot_hold() {
        assert!(to_json(&Dynamic::from_float(f64::NAN), 0).is_err());
        let fp = Dynamic::from(rhai::FnPtr::new("f").unwrap());
        assert!(to_json(&fp, 0).unwrap_err().contains("Fn"));
    }
}
