//! A bundle's header, checked before Avro's reader reads it.

use apache_avro::types::Value;
use std::io::{BufRead, Read, Seek};
use std::path::Path;

/// The keys of a bundle's header metadata, exactly. Avro's reader skips an
/// `avro.` key it does not know, so without this a bundle whose
/// `avro.codec` key was altered opened, read as uncompressed (one byte
/// flipped there, in `every_changed_byte_or_cut_is_refused`, opened in a
/// full suite: the map's order, and so where that key falls, varies).
const HEADER_KEYS: [&str; 5] = [
    "avro.codec",
    "avro.schema",
    "forgelog.bundle",
    "forgelog.manifest",
    "forgelog.sha256",
];

/// Whether the header at `path` holds [`HEADER_KEYS`] and no other: why not.
pub(super) fn header_keys_are_ours(path: &Path) -> Result<(), String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut header = std::io::BufReader::new(file);
    // A file shorter than the magic is named by its length, not as a short read.
    let mut magic = Vec::with_capacity(4);
    (&mut header)
        .take(4)
        .read_to_end(&mut magic)
        .map_err(|e| e.to_string())?;
    match magic.len() {
        0 => return Err("it is empty (0 bytes)".into()),
        n @ 1..4 => {
            return Err(format!(
                "it is cut short: {n} bytes, less than Avro's 4-byte magic"
            ))
        }
        _ => {}
    }
    if magic != b"Obj\x01" {
        return Err("no Avro object container header".into());
    }
    let map = apache_avro::Schema::map(apache_avro::Schema::Bytes);
    let keys: Vec<String> = match apache_avro::from_avro_datum(&map, &mut header, None) {
        Ok(Value::Map(metadata)) => metadata.into_keys().collect(),
        Ok(_) => return Err("its header holds no metadata".into()),
        // Avro's reader says "failed to fill whole buffer" of a file that
        // ends inside the header: said as the cut it is.
        Err(_) if header.fill_buf().is_ok_and(|rest| rest.is_empty()) => {
            let len = header.stream_position().map_err(|e| e.to_string())?;
            return Err(format!(
                "it is cut short: {len} bytes, ending inside its header"
            ));
        }
        Err(e) => return Err(format!("its header: {e}")),
    };
    let mut keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    keys.sort_unstable();
    if keys != HEADER_KEYS {
        return Err(format!(
            "its header's keys are {keys:?}, not {HEADER_KEYS:?}: altered, or written by another tool"
        ));
    }
    Ok(())
}
