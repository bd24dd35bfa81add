//! `/openapi/v2` as protobuf: the Swagger 2.0 document in gnostic's `openapi.v2.Document` message,
//! which is what kubectl asks for (`Accept: application/com.github.proto-openapi.spec.v2@v1.0+protobuf`)
//! when it validates a kind the OpenAPI v3 documents do not list yet (an object whose CRD is created in
//! the same `kubectl apply`). A real API server answers in protobuf only; JSON there fails kubectl's
//! parse ("proto: cannot parse invalid wire-format data").
//!
//! The encoding is the protobuf wire format written by hand for the messages the emulator's document
//! uses (document, info, paths and their operations, parameters and responses, schemas, vendor
//! extensions as YAML): a protobuf crate would need the generated types of the whole gnostic schema
//! for these few messages. What the emulator's document holds and gnostic cannot say is left out, as
//! a real server's v2 document leaves out what Swagger 2.0 cannot say: schemas kube-openapi would
//! reject (an `array` without `items`, several types) lose their type and become arbitrary values.

use serde_json::{Map, Value};

/// The media type kubectl asks for, and the one of the answer.
pub const ACCEPT: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
/// The `Content-Type` a real API server gives the protobuf document.
pub const CONTENT_TYPE: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

/// One message being written.
#[derive(Default)]
struct Message(Vec<u8>);

impl Message {
    fn varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.0.push((value as u8) | 0x80);
            value >>= 7;
        }
        self.0.push(value as u8);
    }

    fn key(&mut self, field: u32, wire_type: u8) {
        self.varint((u64::from(field) << 3) | u64::from(wire_type));
    }

    fn bytes(&mut self, field: u32, bytes: &[u8]) {
        self.key(field, 2);
        self.varint(bytes.len() as u64);
        self.0.extend_from_slice(bytes);
    }

    /// A string field; empty strings are proto3's default and are not written.
    fn string(&mut self, field: u32, value: &str) {
        if !value.is_empty() {
            self.bytes(field, value.as_bytes());
        }
    }

    fn message(&mut self, field: u32, message: Message) {
        self.bytes(field, &message.0);
    }

    fn boolean(&mut self, field: u32, value: bool) {
        if value {
            self.key(field, 0);
            self.varint(1);
        }
    }

    fn double(&mut self, field: u32, value: f64) {
        self.key(field, 1);
        self.0.extend_from_slice(&value.to_le_bytes());
    }

    fn int64(&mut self, field: u32, value: i64) {
        self.key(field, 0);
        self.varint(value as u64);
    }

    /// A string field from `object[name]`, when it is a string.
    fn string_of(&mut self, field: u32, object: &Map<String, Value>, name: &str) {
        if let Some(value) = object.get(name).and_then(Value::as_str) {
            self.string(field, value);
        }
    }

    fn strings_of(&mut self, field: u32, object: &Map<String, Value>, name: &str) {
        for value in array(object, name) {
            if let Some(value) = value.as_str() {
                self.bytes(field, value.as_bytes());
            }
        }
    }

    fn boolean_of(&mut self, field: u32, object: &Map<String, Value>, name: &str) {
        if let Some(value) = object.get(name).and_then(Value::as_bool) {
            self.boolean(field, value);
        }
    }

    /// `x-...` keys as `NamedAny` vendor extensions.
    fn extensions(&mut self, field: u32, object: &Map<String, Value>) {
        for (name, value) in object.iter().filter(|(name, _)| name.starts_with("x-")) {
            self.message(field, named(name, any(value)));
        }
    }
}

fn array<'a>(object: &'a Map<String, Value>, name: &str) -> &'a [Value] {
    object
        .get(name)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// `Named*`: a name (1) and a value (2).
fn named(name: &str, value: Message) -> Message {
    let mut message = Message::default();
    message.string(1, name);
    message.message(2, value);
    message
}

/// `Any`: the value as YAML (2); JSON is YAML.
fn any(value: &Value) -> Message {
    let mut message = Message::default();
    message.string(2, &value.to_string());
    message
}

/// The Swagger 2.0 document (JSON) as an `openapi.v2.Document`.
pub fn document(document: &Value) -> Vec<u8> {
    let empty = Map::new();
    let object = document.as_object().unwrap_or(&empty);
    let mut message = Message::default();
    message.string_of(1, object, "swagger");
    if let Some(info) = object.get("info").and_then(Value::as_object) {
        let mut encoded = Message::default();
        encoded.string_of(1, info, "title");
        encoded.string_of(2, info, "version");
        encoded.string_of(3, info, "description");
        message.message(2, encoded);
    }
    if let Some(paths) = object.get("paths").and_then(Value::as_object) {
        let mut encoded = Message::default();
        for (path, item) in paths {
            encoded.message(2, named(path, path_item(item)));
        }
        message.message(8, encoded);
    }
    if let Some(definitions) = object.get("definitions").and_then(Value::as_object) {
        let mut encoded = Message::default();
        for (name, definition) in definitions {
            encoded.message(1, named(name, schema(definition)));
        }
        message.message(9, encoded);
    }
    message.extensions(16, object);
    message.0
}

fn path_item(item: &Value) -> Message {
    let mut message = Message::default();
    let Some(object) = item.as_object() else {
        return message;
    };
    message.string_of(1, object, "$ref");
    for (method, field) in [
        ("get", 2),
        ("put", 3),
        ("post", 4),
        ("delete", 5),
        ("options", 6),
        ("head", 7),
        ("patch", 8),
    ] {
        if let Some(operation) = object.get(method).and_then(Value::as_object) {
            message.message(field, self::operation(operation));
        }
    }
    for parameter in array(object, "parameters") {
        message.message(9, parameters_item(parameter));
    }
    message.extensions(10, object);
    message
}

fn operation(object: &Map<String, Value>) -> Message {
    let mut message = Message::default();
    message.strings_of(1, object, "tags");
    message.string_of(2, object, "summary");
    message.string_of(3, object, "description");
    message.string_of(5, object, "operationId");
    message.strings_of(6, object, "produces");
    message.strings_of(7, object, "consumes");
    for parameter in array(object, "parameters") {
        message.message(8, parameters_item(parameter));
    }
    if let Some(responses) = object.get("responses").and_then(Value::as_object) {
        let mut encoded = Message::default();
        for (code, response) in responses {
            encoded.message(1, named(code, response_value(response)));
        }
        message.message(9, encoded);
    }
    message.strings_of(10, object, "schemes");
    message.boolean_of(11, object, "deprecated");
    message.extensions(13, object);
    message
}

/// `ParametersItem`: a parameter (1) or a reference (2).
fn parameters_item(parameter: &Value) -> Message {
    let empty = Map::new();
    let object = parameter.as_object().unwrap_or(&empty);
    let mut message = Message::default();
    if object.contains_key("$ref") {
        let mut reference = Message::default();
        reference.string_of(1, object, "$ref");
        reference.string_of(2, object, "description");
        message.message(2, reference);
        return message;
    }
    let mut encoded = Message::default();
    let place = object.get("in").and_then(Value::as_str).unwrap_or_default();
    if place == "body" {
        let mut body = Message::default();
        body.string_of(1, object, "description");
        body.string_of(2, object, "name");
        body.string_of(3, object, "in");
        body.boolean_of(4, object, "required");
        if let Some(schema) = object.get("schema") {
            body.message(5, self::schema(schema));
        }
        body.extensions(6, object);
        encoded.message(1, body);
    } else {
        // NonBodyParameter's sub-schemas: header (1), formData (2), query (3), path (4); header and
        // path have no allowEmptyValue, so their later fields come one number earlier.
        let (which, shift) = match place {
            "header" => (1, 0),
            "formData" => (2, 1),
            "path" => (4, 0),
            _ => (3, 1),
        };
        let mut sub = Message::default();
        sub.boolean_of(1, object, "required");
        sub.string_of(2, object, "in");
        sub.string_of(3, object, "description");
        sub.string_of(4, object, "name");
        if shift == 1 {
            sub.boolean_of(5, object, "allowEmptyValue");
        }
        sub.string_of(5 + shift, object, "type");
        sub.string_of(6 + shift, object, "format");
        sub.boolean_of(19 + shift, object, "uniqueItems");
        sub.extensions(22 + shift, object);
        let mut non_body = Message::default();
        non_body.message(which, sub);
        encoded.message(2, non_body);
    }
    message.message(1, encoded);
    message
}

/// `ResponseValue`: a response (1) or a reference (2).
fn response_value(response: &Value) -> Message {
    let empty = Map::new();
    let object = response.as_object().unwrap_or(&empty);
    let mut message = Message::default();
    if object.contains_key("$ref") {
        let mut reference = Message::default();
        reference.string_of(1, object, "$ref");
        message.message(2, reference);
        return message;
    }
    let mut encoded = Message::default();
    encoded.string_of(1, object, "description");
    if let Some(schema) = object.get("schema") {
        let mut item = Message::default();
        item.message(1, self::schema(schema));
        encoded.message(2, item);
    }
    encoded.extensions(5, object);
    message.message(1, encoded);
    message
}

/// The types kube-openapi's model parser takes, one per schema.
const TYPES: [&str; 6] = ["object", "array", "string", "integer", "number", "boolean"];

/// A JSON schema as a `Schema`.
fn schema(value: &Value) -> Message {
    let mut message = Message::default();
    let Some(object) = value.as_object() else {
        return message;
    };
    message.string_of(1, object, "$ref");
    message.string_of(2, object, "format");
    message.string_of(3, object, "title");
    message.string_of(4, object, "description");
    if let Some(default) = object.get("default") {
        message.message(5, any(default));
    }
    for (name, field) in [("multipleOf", 6), ("maximum", 7), ("minimum", 9)] {
        if let Some(number) = object.get(name).and_then(Value::as_f64) {
            message.double(field, number);
        }
    }
    message.boolean_of(8, object, "exclusiveMaximum");
    message.boolean_of(10, object, "exclusiveMinimum");
    for (name, field) in [
        ("maxLength", 11),
        ("minLength", 12),
        ("maxItems", 14),
        ("minItems", 15),
        ("maxProperties", 17),
        ("minProperties", 18),
    ] {
        if let Some(number) = object.get(name).and_then(Value::as_i64) {
            message.int64(field, number);
        }
    }
    message.string_of(13, object, "pattern");
    message.boolean_of(16, object, "uniqueItems");
    message.strings_of(19, object, "required");
    for value in array(object, "enum") {
        message.message(20, any(value));
    }
    match object.get("additionalProperties") {
        Some(Value::Bool(allowed)) => {
            let mut item = Message::default();
            item.boolean(2, *allowed);
            message.message(21, item);
        }
        Some(nested @ Value::Object(_)) => {
            let mut item = Message::default();
            item.message(1, schema(nested));
            message.message(21, item);
        }
        _ => {}
    }
    let items: Vec<&Value> = match object.get("items") {
        Some(Value::Array(each)) => each.iter().collect(),
        Some(one @ Value::Object(_)) => vec![one],
        _ => Vec::new(),
    };
    let kind = object
        .get("type")
        .and_then(Value::as_str)
        .filter(|kind| TYPES.contains(kind))
        // An array must have exactly one item schema for kube-openapi; otherwise say nothing.
        .filter(|kind| *kind != "array" || items.len() == 1);
    if let Some(kind) = kind {
        let mut item = Message::default();
        item.string(1, kind);
        message.message(22, item);
    }
    if !items.is_empty() {
        let mut encoded = Message::default();
        for item in items {
            encoded.message(1, schema(item));
        }
        message.message(23, encoded);
    }
    for nested in array(object, "allOf") {
        message.message(24, schema(nested));
    }
    if let Some(properties) = object.get("properties").and_then(Value::as_object) {
        let mut encoded = Message::default();
        for (name, property) in properties {
            encoded.message(1, named(name, schema(property)));
        }
        message.message(25, encoded);
    }
    message.boolean_of(27, object, "readOnly");
    if let Some(example) = object.get("example") {
        message.message(30, any(example));
    }
    message.extensions(31, object);
    message
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn varints_take_seven_bits_a_byte() {
        let mut message = Message::default();
        message.varint(1);
        message.varint(300);
        message.varint(u64::MAX);
        assert_eq!(
            message.0,
            [1, 0xAC, 0x02, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]
        );
    }

    /// A small document, encoded by hand from gnostic's `OpenAPIv2.proto`.
    #[test]
    fn a_document_is_encoded_field_by_field() {
        let doc = json!({
            "swagger": "2.0",
            "info": {"title": "K", "version": "v"},
            "definitions": {"d": {"type": "string", "x-a": 1}},
        });
        // type (22) is TypeItem{value(1): "string"}; vendor_extension (31) is NamedAny{name "x-a", value Any{yaml "1"}}.
        let mut type_item = vec![0xB2, 0x01, 8, 0x0A, 6];
        type_item.extend_from_slice(b"string");
        let mut extension = vec![0xFA, 0x01, 10, 0x0A, 3];
        extension.extend_from_slice(b"x-a");
        extension.extend_from_slice(&[0x12, 3, 0x12, 1, b'1']);
        let definition: Vec<u8> = [type_item, extension].concat();
        let mut named_schema = vec![0x0A, 1, b'd', 0x12, definition.len() as u8];
        named_schema.extend_from_slice(&definition);
        let mut definitions = vec![0x0A, named_schema.len() as u8];
        definitions.extend_from_slice(&named_schema);
        let mut expected = vec![
            0x0A, 3, b'2', b'.', b'0', 0x12, 6, 0x0A, 1, b'K', 0x12, 1, b'v',
        ];
        expected.extend_from_slice(&[0x4A, definitions.len() as u8]);
        expected.extend_from_slice(&definitions);
        assert_eq!(document(&doc), expected);
    }

    #[test]
    fn arrays_without_one_item_schema_lose_their_type() {
        let with = schema(&json!({"type": "array", "items": {"type": "string"}})).0;
        let without = schema(&json!({"type": "array"})).0;
        assert_eq!(without, Vec::<u8>::new());
        assert!(with.starts_with(&[0xB2, 0x01, 7, 0x0A, 5]));
    }

    #[test]
    fn query_and_path_parameters_use_their_own_field_numbers() {
        let query = parameters_item(
            &json!({"name": "f", "in": "query", "type": "string", "uniqueItems": true}),
        )
        .0;
        // ParametersItem{parameter(1): Parameter{non_body(2): NonBody{query(3): {in(2), name(4), type(6), unique(20)}}}}
        let sub = [
            &[0x12, 5][..],
            b"query",
            &[0x22, 1, b'f'],
            &[0x32, 6],
            b"string",
            &[0xA0, 0x01, 1],
        ]
        .concat();
        let non_body = [&[0x1A, sub.len() as u8][..], &sub].concat();
        let parameter = [&[0x12, non_body.len() as u8][..], &non_body].concat();
        assert_eq!(
            query,
            [&[0x0A, parameter.len() as u8][..], &parameter].concat()
        );
        let path = parameters_item(&json!({"name": "n", "in": "path", "type": "string"})).0;
        assert!(
            path.windows(2).any(|w| w == [0x2A, 6]),
            "type is field 5 in a path parameter: {path:?}"
        );
    }
}
