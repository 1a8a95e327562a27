// Compiles the C shim through which every SQLite call of the adapter goes, against the
// sqlite3ext.h that libsqlite3-sys ships (it exports its include directory as DEP_SQLITE3_INCLUDE).
fn main() {
    let include =
        std::env::var("DEP_SQLITE3_INCLUDE").expect("libsqlite3-sys exports its include dir");
    println!("cargo:rerun-if-changed=src/shim.c");
    cc::Build::new()
        .file("src/shim.c")
        .include(include)
        .warnings(true)
        .compile("bpe_shim");
}
