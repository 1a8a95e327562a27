module sqlitebpe

go 1.22

require github.com/mattn/go-sqlite3 v1.14.28
