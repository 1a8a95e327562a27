//! The operator statements: every accepted form, every refused input (with the problem named),
//! their effect on an engine, and properties of the parser.

mod common;

use bpe_core::{Config, Engine, ExtensionState, Sharing};
use bpe_tsql::{parse, run, Statement, StatementError};
use common::{make_file, read, tempdir, PAGE};
use proptest::prelude::*;
use std::path::PathBuf;

const GB: u64 = 1 << 30;
const MB: u64 = 1 << 20;

fn one(text: &str) -> Statement {
    let mut all = parse(text).unwrap_or_else(|e| panic!("{text:?} was refused: {e}"));
    assert_eq!(all.len(), 1, "{text:?} gave {all:?}");
    all.pop().unwrap()
}

fn on(path: &str, size_bytes: u64) -> Statement {
    Statement::ExtensionOn {
        path: PathBuf::from(path),
        size_bytes,
        sharing: None,
    }
}

/// The error text for `text`, which must be refused by the parser.
fn refused(text: &str) -> String {
    match parse(text) {
        Ok(s) => panic!("{text:?} was accepted as {s:?}"),
        Err(e) => e.to_string(),
    }
}

fn assert_names(text: &str, needles: &[&str]) {
    let err = refused(text);
    for needle in needles {
        assert!(
            err.contains(needle),
            "error for {text:?} is {err:?}; expected {needle:?}"
        );
    }
}

const ALTER: &str = "ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION";

fn alter_on(options: &str) -> String {
    format!("{ALTER} ON ({options})")
}

#[test]
fn extension_on_in_every_unit_and_layout() {
    let cases = [
        (
            "FILENAME = '/ssd/a.bpe', SIZE = 4 GB",
            on("/ssd/a.bpe", 4 * GB),
        ),
        (
            "FILENAME = '/ssd/a.bpe', SIZE = 4GB",
            on("/ssd/a.bpe", 4 * GB),
        ),
        (
            "FILENAME = '/ssd/a.bpe', SIZE = 512 mb",
            on("/ssd/a.bpe", 512 * MB),
        ),
        (
            "FILENAME = '/ssd/a.bpe', SIZE = 2048 KB",
            on("/ssd/a.bpe", 2 * MB),
        ),
        (
            "FILENAME = '/ssd/a.bpe', SIZE = 1 TB",
            on("/ssd/a.bpe", 1024 * GB),
        ),
        (
            "SIZE = 1 GB, FILENAME = N'/ssd/b.bpe'",
            on("/ssd/b.bpe", GB),
        ),
        (
            "FILENAME = '/ssd/it''s.bpe', SIZE = 1 GB",
            on("/ssd/it's.bpe", GB),
        ),
    ];
    for (options, expected) in cases {
        assert_eq!(one(&alter_on(options)), expected, "{options}");
    }
    let spread = "alter server\n  configuration set buffer pool extension on\n(\n\tFILENAME='/x/y.bpe' ,\n SIZE=8 GB\n)\n;";
    assert_eq!(one(spread), on("/x/y.bpe", 8 * GB));
    let commented = "-- enable\nALTER SERVER CONFIGURATION /* the */ SET BUFFER POOL EXTENSION ON (FILENAME = '/x', SIZE = 1 GB) -- done";
    assert_eq!(one(commented), on("/x", GB));
}

#[test]
fn extension_off_memory_reconfigure_and_dbcc() {
    assert_eq!(one(&format!("{ALTER} OFF")), Statement::ExtensionOff);
    assert_eq!(
        one(&format!("{} off;", ALTER.to_lowercase())),
        Statement::ExtensionOff
    );

    let set = |megabytes| Statement::MaxServerMemory { megabytes };
    for text in [
        "EXEC sp_configure 'max server memory (MB)', 256",
        "EXECUTE sp_configure 'max server memory (MB)', 256;",
        "exec SP_CONFIGURE N'max server memory (MB)', N'256'",
        "sp_configure 'max server memory (MB)', '256'",
        "EXEC sp_configure 'max server memory', 256",
        "EXEC sp_configure 'Max  Server Memory (mb)', 256",
        "EXEC sys.sp_configure 'max server memory (MB)', 256",
        "EXEC master.dbo.sp_configure 'max server memory (MB)', 256",
        "EXEC master..sp_configure 'max server memory (MB)', 256",
        "EXEC [sp_configure] 'max server memory (MB)', 256",
        "EXEC sp_configure @configname = N'max server memory (MB)', @configvalue = 256",
    ] {
        assert_eq!(one(text), set(256), "{text}");
    }
    for text in [
        "EXEC sp_configure 'max server memory (MB)'",
        "sp_configure 'max server memory'",
        "EXEC sp_configure",
    ] {
        assert_eq!(one(text), Statement::ShowMaxServerMemory, "{text}");
    }
    assert_eq!(
        one("EXEC sp_configure 'show advanced options', 1"),
        Statement::ShowAdvancedOptions { value: Some(true) }
    );
    assert_eq!(
        one("sp_configure 'show advanced options'"),
        Statement::ShowAdvancedOptions { value: None }
    );
    assert_eq!(one("RECONFIGURE"), Statement::Reconfigure);
    assert_eq!(one("reconfigure with override;"), Statement::Reconfigure);
    assert_eq!(one("DBCC DROPCLEANBUFFERS"), Statement::DropCleanBuffers);
    assert_eq!(
        one("dbcc dropcleanbuffers with no_infomsgs"),
        Statement::DropCleanBuffers
    );
}

#[test]
fn several_statements_per_text() {
    let script = "EXEC sp_configure 'show advanced options', 1;\nRECONFIGURE;\n\
                  EXEC sp_configure 'max server memory (MB)', 64 RECONFIGURE WITH OVERRIDE\n\
                  ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON (FILENAME = '/s/e.bpe', SIZE = 1 GB)\n\
                  DBCC DROPCLEANBUFFERS;;";
    assert_eq!(
        parse(script).unwrap(),
        vec![
            Statement::ShowAdvancedOptions { value: Some(true) },
            Statement::Reconfigure,
            Statement::MaxServerMemory { megabytes: 64 },
            Statement::Reconfigure,
            on("/s/e.bpe", GB),
            Statement::DropCleanBuffers,
        ]
    );
    assert_eq!(parse("").unwrap(), vec![]);
    assert_eq!(parse(" ; -- nothing\n /* at all */ ").unwrap(), vec![]);
}

#[test]
fn bad_sizes_are_refused_naming_the_problem() {
    let size = |s: &str| alter_on(&format!("FILENAME = '/ssd/a.bpe', SIZE = {s}"));
    assert_names(&size("0 GB"), &["SIZE '0 GB'", "greater than 0"]);
    assert_names(&size("-1 GB"), &["SIZE '-1 GB'", "positive"]);
    assert_names(&size("+1 GB"), &["SIZE '+1 GB'", "no sign"]);
    assert_names(&size("99999999999999999999 GB"), &["too large"]);
    assert_names(&size("16777216 TB"), &["SIZE '16777216 TB'", "too large"]);
    assert_names(&size("4"), &["SIZE '4'", "unit is required"]);
    assert_names(&size("4 PB"), &["SIZE '4 PB'", "unknown unit"]);
    assert_names(&size("4 pages"), &["unknown unit"]);
    assert_names(&size("1.5 GB"), &["SIZE '1.5 GB'", "whole number"]);
    assert_names(&size("GB"), &["Msg 102", "near 'GB'", "a size"]);
    assert_names(&size("'4 GB'"), &["Msg 102", "a size"]);
}

#[test]
fn bad_paths_are_refused_naming_the_problem() {
    let path = |p: &str| alter_on(&format!("FILENAME = {p}, SIZE = 4 GB"));
    assert_names(&path("'ssd/a.bpe'"), &["FILENAME 'ssd/a.bpe'", "absolute"]);
    assert_names(&path("'a.bpe'"), &["absolute"]);
    assert_names(&path("''"), &["empty"]);
    assert_names(&path("/ssd/a.bpe"), &["Msg 102", "single quotes"]);
    assert_names(
        &path("'/ssd/a.bpe"),
        &["Msg 105", "Unclosed quotation mark"],
    );
}

#[test]
fn bad_memory_values_and_options_are_refused() {
    let mem = |v: &str| format!("EXEC sp_configure 'max server memory (MB)', {v}");
    assert_names(
        &mem("0"),
        &["Msg 15129", "'0'", "max server memory (MB)", "at least 1"],
    );
    assert_names(&mem("-5"), &["Msg 15129", "'-5'", "positive"]);
    assert_names(&mem("N'-5'"), &["Msg 15129", "positive"]);
    assert_names(&mem("99999999999999"), &["Msg 15129", "too large"]);
    assert_names(&mem("1.5"), &["Msg 15129", "whole number"]);
    assert_names(&mem("'lots'"), &["Msg 15129", "'lots'", "not a number"]);
    assert_names(&mem(""), &["Msg 102", "a value"]);
    assert_names(
        "EXEC sp_configure 'max degree of parallelism', 4",
        &["Msg 15123", "'max degree of parallelism' does not exist"],
    );
    assert_names(
        "EXEC sp_configure 'show advanced options', 2",
        &["Msg 15129", "'2'", "0 or 1"],
    );
    assert_names("EXEC sp_who", &["Msg 2812", "sp_who"]);
    assert_names("EXEC other.schema.sp_configure 'x'", &["Msg 2812"]);
}

#[test]
fn malformed_statements_and_trailing_garbage_are_refused() {
    assert_names(ALTER, &["Msg 102", "near 'EXTENSION'", "ON or OFF"]);
    assert_names(
        "ALTER SERVER CONFIGURATION SET BUFFER POOL ON",
        &["near 'ON'", "EXTENSION"],
    );
    assert_names(
        &format!("{ALTER} ON FILENAME = '/a', SIZE = 1 GB"),
        &["'('"],
    );
    assert_names(
        &format!("{ALTER} ON (FILENAME = '/a', SIZE = 1 GB"),
        &["')'"],
    );
    assert_names(&alter_on("FILENAME = '/a'"), &["SIZE", "required"]);
    assert_names(&alter_on("SIZE = 1 GB"), &["FILENAME", "required"]);
    assert_names(
        &alter_on("FILENAME = '/a', FILENAME = '/b', SIZE = 1 GB"),
        &["near 'FILENAME'", "only once"],
    );
    assert_names(
        &alter_on("FILENAME = '/a', SIZE = 1 GB, COLOR = 1"),
        &["near 'COLOR'"],
    );
    assert_names(&format!("{ALTER} OFF now"), &["Msg 102", "near 'now'"]);
    assert_names(&format!("{ALTER} OFF OFF"), &["near 'OFF'"]);
    assert_names(&alter_on("FILENAME = '/a', SIZE = 1 GB) x"), &["near 'x'"]);
    assert_names("DBCC DROPCLEANBUFFERS please", &["near 'please'"]);
    assert_names("DBCC DROPCLEANBUFFERS WITH", &["NO_INFOMSGS"]);
    assert_names("DBCC FREEPROCCACHE", &["Msg 2526", "FREEPROCCACHE"]);
    assert_names("RECONFIGURE WITH", &["OVERRIDE"]);
    assert_names(
        "SELECT 1",
        &["Msg 102", "near 'SELECT'", "ALTER SERVER CONFIGURATION"],
    );
    assert_names(
        "DBCC DROPCLEANBUFFERS\nGO",
        &["near 'GO'", "batch separator"],
    );
    assert_names("RECONFIGURE\n\n  bogus", &["Line 3", "near 'bogus'"]);
    assert_names("/* never closed", &["Msg 113"]);
    assert_names("RECONFIGURE ^", &["near '^'"]);
}

// ---- execution ----

fn engine() -> std::sync::Arc<Engine> {
    Engine::new(Config::default())
}

#[test]
fn max_server_memory_is_set_and_shown() {
    let e = engine();
    let status = run(
        &e,
        "EXEC sp_configure 'max server memory (MB)', 64; RECONFIGURE",
    )
    .unwrap();
    assert_eq!(e.max_memory(), 64 * MB);
    assert!(status.contains("changed from 128 to 64"), "{status}");
    let shown = run(&e, "EXEC sp_configure 'max server memory (MB)'").unwrap();
    assert!(shown.contains("max server memory (MB) = 64"), "{shown}");
    run(&e, "EXEC sp_configure 'show advanced options', 1").unwrap();
    assert_eq!(
        e.max_memory(),
        64 * MB,
        "show advanced options changed memory"
    );
}

#[test]
fn extension_is_enabled_resized_and_disabled() {
    let dir = tempdir();
    let file = dir.path().join("ext.bpe");
    let path = file.display();
    let e = engine();
    let status = run(
        &e,
        &format!(
            "EXEC sp_configure 'max server memory (MB)', 4\n\
             {ALTER} ON (FILENAME = '{path}', SIZE = 16 MB)"
        ),
    )
    .unwrap();
    assert!(status.contains("enabled"), "{status}");
    let s = e.extension_status();
    assert_eq!((s.state, s.size_bytes), (ExtensionState::Enabled, 16 * MB));
    assert!(file.exists());

    let status = run(&e, &alter_on(&format!("FILENAME = '{path}', SIZE = 32 MB"))).unwrap();
    assert!(status.contains("resized from 16 MB to 32 MB"), "{status}");
    assert_eq!(e.extension_status().size_bytes, 32 * MB);

    let status = run(
        &e,
        &alter_on(&format!("FILENAME = '{path}', SIZE = 32768 KB")),
    )
    .unwrap();
    assert!(status.contains("nothing changed"), "{status}");

    let other = dir.path().join("other.bpe");
    let err = run(
        &e,
        &alter_on(&format!("FILENAME = '{}', SIZE = 32 MB", other.display())),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("already enabled"), "{err}");
    assert!(!other.exists());

    run(&e, &format!("{ALTER} OFF")).unwrap();
    assert_eq!(e.extension_status().state, ExtensionState::Disabled);
    assert!(!file.exists(), "disabling left the file");
    let status = run(&e, &format!("{ALTER} OFF")).unwrap();
    assert!(status.contains("already disabled"), "{status}");
}

#[test]
fn shared_on_or_off_is_parsed_and_a_bad_value_is_refused() {
    let with = |sharing| Statement::ExtensionOn {
        path: PathBuf::from("/ssd/a.bpe"),
        size_bytes: GB,
        sharing: Some(sharing),
    };
    assert_eq!(
        one(&alter_on(
            "FILENAME = '/ssd/a.bpe', SIZE = 1 GB, SHARED = OFF"
        )),
        with(Sharing::Private)
    );
    assert_eq!(
        one(&alter_on(
            "shared = on, FILENAME = '/ssd/a.bpe', SIZE = 1 GB"
        )),
        with(Sharing::Shared)
    );
    assert_names(
        &alter_on("FILENAME = '/a', SIZE = 1 GB, SHARED = YES"),
        &["SHARED = ON or SHARED = OFF"],
    );
    assert_names(
        &alter_on("FILENAME = '/a', SIZE = 1 GB, SHARED = ON, SHARED = OFF"),
        &["SHARED only once"],
    );
}

#[test]
fn an_extension_is_shared_unless_the_statement_says_off_and_its_sharing_changes_only_through_off() {
    let dir = tempdir();
    let file = dir.path().join("ext.bpe");
    let path = file.display();
    let e = engine();
    run(&e, "EXEC sp_configure 'max server memory (MB)', 4").unwrap();

    let status = run(&e, &alter_on(&format!("FILENAME = '{path}', SIZE = 16 MB"))).unwrap();
    assert!(status.contains("(shared)"), "{status}");
    assert_eq!(e.extension_status().sharing, Some(Sharing::Shared));
    run(&e, &format!("{ALTER} OFF")).unwrap();

    let status = run(
        &e,
        &alter_on(&format!("FILENAME = '{path}', SIZE = 16 MB, SHARED = OFF")),
    )
    .unwrap();
    assert!(status.contains("(private)"), "{status}");
    assert_eq!(e.extension_status().sharing, Some(Sharing::Private));

    // The other sharing at the same path, even with a new size, is refused and changes nothing.
    let err = run(
        &e,
        &alter_on(&format!("FILENAME = '{path}', SIZE = 32 MB, SHARED = ON")),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("enabled private") && err.contains("OFF first"),
        "{err}"
    );
    let s = e.extension_status();
    assert_eq!((s.sharing, s.size_bytes), (Some(Sharing::Private), 16 * MB));
    // Saying nothing keeps what is enabled: a resize of the private extension.
    run(&e, &alter_on(&format!("FILENAME = '{path}', SIZE = 32 MB"))).unwrap();
    let s = e.extension_status();
    assert_eq!((s.sharing, s.size_bytes), (Some(Sharing::Private), 32 * MB));
    run(&e, &format!("{ALTER} OFF")).unwrap();
    assert_eq!(e.extension_status().sharing, None);
}

#[test]
fn execution_refusals_carry_the_cores_reason() {
    let dir = tempdir();
    let e = engine();
    let path = dir.path().join("ext.bpe");
    let err = run(
        &e,
        &alter_on(&format!("FILENAME = '{}', SIZE = 64 MB", path.display())),
    )
    .unwrap_err();
    assert!(matches!(err, StatementError::Invalid { .. }));
    let text = err.to_string();
    assert!(text.starts_with("Msg 868:"), "{text}");
    assert!(text.contains("64 MB") && text.contains("128 MB"), "{text}");

    // Huge but representable: the index would not fit in memory.
    let err = run(
        &e,
        &alter_on(&format!("FILENAME = '{}', SIZE = 1000 TB", path.display())),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("index memory"), "{err}");
    assert!(!path.exists());

    let missing_dir = dir.path().join("no/such/dir/ext.bpe");
    let err = run(
        &e,
        &alter_on(&format!(
            "FILENAME = '{}', SIZE = 1 GB",
            missing_dir.display()
        )),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("directory"), "{err}");

    assert!(matches!(run(&e, " ; "), Err(StatementError::Empty)));
    assert_eq!(e.extension_status().state, ExtensionState::Disabled);
}

#[test]
fn a_parse_error_anywhere_changes_nothing() {
    let e = engine();
    let err = run(
        &e,
        "EXEC sp_configure 'max server memory (MB)', 32\nDBCC BOGUS",
    )
    .unwrap_err();
    assert!(err.to_string().contains("Msg 2526"));
    assert_eq!(
        e.max_memory(),
        128 * MB,
        "a statement ran before the text was parsed"
    );
}

/// The whole text is validated against the settings each statement would leave before any
/// runs: a refusal anywhere changes nothing, and the message says which statement.
#[test]
fn a_refused_statement_anywhere_changes_nothing() {
    let dir = tempdir();
    let path = dir.path().join("ext.bpe");
    let e = engine();
    let text = format!(
        "EXEC sp_configure 'max server memory (MB)', 32\n\
         {ALTER} ON (FILENAME = '{}', SIZE = 16 MB)\n\
         EXEC sp_configure 'max server memory (MB)', 8",
        path.display()
    );
    let err = run(&e, &text).unwrap_err().to_string();
    assert!(
        err.contains("Msg 868") && err.contains("statement 2 of 3; nothing was changed"),
        "{err}"
    );
    assert_eq!(e.max_memory(), 128 * MB, "the first statement took effect");
    assert!(!path.exists());
    // Checked against what the earlier statements leave: 32 MB of memory makes 64 MB valid.
    let ok = format!(
        "EXEC sp_configure 'max server memory (MB)', 32\n\
         {ALTER} ON (FILENAME = '{}', SIZE = 64 MB)",
        path.display()
    );
    run(&e, &ok).unwrap();
    assert_eq!(e.max_memory(), 32 * MB);
    assert_eq!(e.extension_status().size_bytes, 64 * MB);
    // An existing file named in the last statement: the memory change before it does not run.
    let taken = dir.path().join("taken");
    std::fs::write(&taken, b"x").unwrap();
    let text = format!(
        "EXEC sp_configure 'max server memory (MB)', 8; {ALTER} OFF; \
         {ALTER} ON (FILENAME = '{}', SIZE = 64 MB)",
        taken.display()
    );
    let err = run(&e, &text).unwrap_err().to_string();
    assert!(
        err.contains("statement 3 of 3; nothing was changed"),
        "{err}"
    );
    assert_eq!(e.max_memory(), 32 * MB);
    assert_eq!(e.extension_status().state, ExtensionState::Enabled);
    let err = run(&e, "EXEC sp_configure 'max server memory (MB)', 1000000000").unwrap_err();
    assert!(err.to_string().contains("physical memory"), "{err}");
    // In the unit sp_configure takes, MB, not in bytes.
    assert!(
        err.to_string()
            .contains("max server memory 1000000000 MB is above this machine's physical memory ("),
        "{err}"
    );
    assert!(!err.to_string().contains("bytes"), "{err}");
}

#[test]
fn dropcleanbuffers_empties_the_pool() {
    let dir = tempdir();
    let e = engine();
    let data = make_file(dir.path(), "data", 16, PAGE);
    let f = e.open_file(&data, PAGE).unwrap();
    for p in 0..16 {
        read(&e, &f, p);
    }
    assert!(!e.descriptors().is_empty());
    let status = run(&e, "DBCC DROPCLEANBUFFERS WITH NO_INFOMSGS").unwrap();
    assert!(status.contains("DROPCLEANBUFFERS"), "{status}");
    assert!(e.descriptors().is_empty(), "pages still cached");
}

// ---- properties ----

/// Renders `statement` with random keyword case, whitespace and comments between tokens.
fn render(statement: &Statement, case: &[bool], gaps: &[&str]) -> String {
    enum Piece {
        Keyword(String),
        Literal(String),
    }
    use Piece::*;
    let kw = |s: &str| s.split(' ').map(|w| Keyword(w.into())).collect::<Vec<_>>();
    let quoted = |s: &str| Literal(format!("'{}'", s.replace('\'', "''")));
    let mut pieces = match statement {
        Statement::ExtensionOn {
            path,
            size_bytes,
            sharing,
        } => {
            let mut p = kw("ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON ( FILENAME =");
            p.push(quoted(&path.to_string_lossy()));
            p.extend(kw(", SIZE ="));
            p.push(Literal((size_bytes / MB).to_string()));
            p.extend(kw("MB"));
            match sharing {
                Some(Sharing::Shared) => p.extend(kw(", SHARED = ON")),
                Some(Sharing::Private) => p.extend(kw(", SHARED = OFF")),
                None => {}
            }
            p.extend(kw(")"));
            p
        }
        Statement::ExtensionOff => kw("ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION OFF"),
        Statement::MaxServerMemory { megabytes } => {
            let mut p = kw("EXEC sp_configure");
            p.push(quoted("max server memory (MB)"));
            p.extend(kw(","));
            p.push(Literal(megabytes.to_string()));
            p
        }
        Statement::ShowMaxServerMemory => {
            let mut p = kw("EXECUTE sp_configure");
            p.push(quoted("max server memory (MB)"));
            p
        }
        Statement::ShowAdvancedOptions { value } => {
            let mut p = kw("sp_configure");
            p.push(quoted("show advanced options"));
            if let Some(v) = value {
                p.extend(kw(","));
                p.push(Literal(u8::from(*v).to_string()));
            }
            p
        }
        Statement::Reconfigure => kw("RECONFIGURE WITH OVERRIDE"),
        Statement::DropCleanBuffers => kw("DBCC DROPCLEANBUFFERS"),
    };
    pieces.push(Keyword(";".into()));
    let mut out = String::new();
    for (i, piece) in pieces.iter().enumerate() {
        out.push_str(gaps[i % gaps.len()]);
        match piece {
            Keyword(k) if case[i % case.len()] => out.push_str(&k.to_lowercase()),
            Keyword(k) => out.push_str(k),
            Literal(l) => out.push_str(l),
        }
    }
    out
}

fn statement_strategy() -> impl Strategy<Value = Statement> {
    prop_oneof![
        (
            "/[a-zA-Z0-9 ._'-]{1,20}",
            1u64..1_000_000,
            proptest::option::of(prop_oneof![Just(Sharing::Shared), Just(Sharing::Private)])
        )
            .prop_map(|(path, mb, sharing)| Statement::ExtensionOn {
                path: PathBuf::from(path),
                size_bytes: mb * MB,
                sharing,
            }),
        Just(Statement::ExtensionOff),
        (1u64..1_000_000_000).prop_map(|megabytes| Statement::MaxServerMemory { megabytes }),
        Just(Statement::ShowMaxServerMemory),
        proptest::option::of(any::<bool>())
            .prop_map(|value| Statement::ShowAdvancedOptions { value }),
        Just(Statement::Reconfigure),
        Just(Statement::DropCleanBuffers),
    ]
}

fn gap_strategy() -> impl Strategy<Value = &'static str> {
    proptest::sample::select(vec![
        " ",
        "  ",
        "\t",
        "\n",
        "\r\n",
        " /* c */ ",
        " -- c\n",
        "\n\n ",
    ])
}

/// Fragments that push random texts deep into the grammar.
fn fragment_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::sample::select(vec![
            "ALTER",
            "SERVER",
            "CONFIGURATION",
            "SET",
            "BUFFER",
            "POOL",
            "EXTENSION",
            "ON",
            "OFF",
            "(",
            ")",
            "FILENAME",
            "=",
            "SIZE",
            "GB",
            "KB",
            "TB",
            ",",
            ";",
            "EXEC",
            "sp_configure",
            "'max server memory (MB)'",
            "N'",
            "'",
            "''",
            "RECONFIGURE",
            "WITH",
            "OVERRIDE",
            "DBCC",
            "DROPCLEANBUFFERS",
            "-",
            ".",
            "[",
            "]",
            "/*",
            "*/",
            "--",
            "\n",
            "@configvalue",
            "GO",
            "1.5",
            "0",
            "18446744073709551616",
        ])
        .prop_map(String::from),
        "[0-9]{1,25}",
        "\\PC{0,4}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn printable_text_never_panics_the_parser(text in "\\PC{0,200}") {
        let _ = parse(&text);
    }

    #[test]
    fn statement_shaped_text_never_panics_the_parser(
        parts in proptest::collection::vec(fragment_strategy(), 0..40),
        gaps in proptest::collection::vec(proptest::sample::select(vec!["", " ", "\n"]), 1..8),
    ) {
        let text: String = parts
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{}{p}", gaps[i % gaps.len()]))
            .collect();
        let _ = parse(&text);
    }

    #[test]
    fn statements_round_trip_with_any_case_and_whitespace(
        statements in proptest::collection::vec(statement_strategy(), 1..5),
        case in proptest::collection::vec(any::<bool>(), 1..16),
        gaps in proptest::collection::vec(gap_strategy(), 1..16),
    ) {
        let text: String = statements.iter().map(|s| render(s, &case, &gaps)).collect();
        prop_assert_eq!(parse(&text).map_err(|e| e.to_string()), Ok(statements.clone()), "{}", text);
        // The canonical text parses back too.
        let canonical: String = statements.iter().map(|s| format!("{s};\n")).collect();
        prop_assert_eq!(parse(&canonical).map_err(|e| e.to_string()), Ok(statements));
    }
}
