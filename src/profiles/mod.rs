//! Sandbox profiles: operator-editable descriptions of what a cell may do.

/// A sandbox profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    pub name: String,
}

#[derive(Debug, thiserror::Error)]
#[error("unknown profile {0:?}: use rhai, python, shell or a path to a .toml file")]
pub struct ProfileError(String);

impl Profile {
    pub fn load(name_or_path: &str) -> Result<Profile, ProfileError> {
        match name_or_path {
            "rhai" | "python" | "shell" => Ok(Profile {
                name: name_or_path.to_owned(),
            }),
            other => Err(ProfileError(other.to_owned())),
        }
    }
}
