//! One engine owns a data file at a time: a second engine (as in a second process) is refused
//! with a named error until the first lets go, so two caches never disagree about one file.

mod common;
use bpe_core::Error;
use common::*;

#[test]
fn a_second_engine_is_refused_until_the_first_closes() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 4, PAGE);
    let first = engine(1 << 20);
    let second = engine(1 << 20);
    let a = first.open_file(&path, PAGE).unwrap();
    let shared = first.open_file(&path, PAGE).unwrap();
    match second.open_file(&path, PAGE) {
        Err(e @ Error::OwnedByAnotherProcess { .. }) => {
            assert!(e.to_string().contains("another process"))
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("two engines own one file"),
    }
    first.close_file(&a);
    drop(a);
    assert!(
        second.open_file(&path, PAGE).is_err(),
        "released while an opener remains"
    );
    first.close_file(&shared);
    drop(shared); // the descriptors, and the claim, go with the last handle
    let b = second.open_file(&path, PAGE).unwrap();
    assert_eq!(decode(&read(&second, &b, 2).0), Some((2, 0)));
}
