//! The operator-statement parser must refuse any input with an error, never panic or hang.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(statements) = bpe_tsql::parse(text) {
            // What was accepted has a canonical text that parses back to the same statements.
            let canonical: String = statements.iter().map(|s| format!("{s};\n")).collect();
            let again = bpe_tsql::parse(&canonical)
                .unwrap_or_else(|e| panic!("canonical text {canonical:?} refused: {e}"));
            assert_eq!(again, statements);
        }
    }
});
